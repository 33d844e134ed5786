"""The AgentOps intent surface (a job seen as an intent): where a new one stands in the queue and
when it may start, and how a running one is doing. An intent is a job; these are read models
over the job store, for the HTTP API's `/agentops/intents` (docs/reference/http-api.md).

The start estimate: the jobs queued ahead of it, divided by the jobs that may run at once, times
the mean duration of the latest finished runs (`RECENT` of them; none yet: `DEFAULT_SERVICE_S`).
It is a rough guide, not a promise: priorities, caps, pauses and breakers move it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.config import Config
from corral.core.ports import JobGovernance, JobTraces
from corral.domain.models import Job

RECENT = 50  # finished runs the mean service time looks at
DEFAULT_SERVICE_S = 60.0  # the service time assumed before any run has finished


@dataclass(frozen=True, slots=True)
class Placement:
    queue_position: int  # jobs ahead of it (0: next)
    estimated_start_s: float


@dataclass(frozen=True, slots=True)
class Progress:
    status: str
    checkpoint: dict[str, object] | None
    tool_call_count: int
    duration_ms: int | None


async def placement(store: JobGovernance, config: Config, job: Job) -> Placement:
    """Where a queued job stands, and about when it may start."""
    ahead = await store.queued_ahead(job)
    runs = [r for r in await store.run_unified(RECENT) if r.duration_ms is not None]
    service_s = (
        sum(r.duration_ms or 0 for r in runs) / len(runs) / 1000 if runs else DEFAULT_SERVICE_S
    )
    env = config.settings.environments.get(job.env_name)
    slots = max(1, env.max_inflight if env is not None else 1)
    waves = 0 if ahead == 0 else math.ceil(ahead / slots)
    return Placement(ahead, round(waves * service_s, 3))


async def progress(store: JobTraces, job: Job) -> Progress:
    """The job's state, its latest checkpoint, its tool calls so far and how long it ran."""
    checkpoints = await store.checkpoints(job.id)
    last = checkpoints[-1] if checkpoints else None
    calls = sum(len(e.tool_calls) for e in await store.agent_events(job.id))
    if last is not None:
        calls = max(calls, last.tool_call_count)
    attempts = await store.attempts(job.id)
    started = [a.started_at for a in attempts if a.started_at is not None]
    ended = [a.ended_at for a in attempts if a.ended_at is not None]
    duration = None
    if started:
        end = max(ended) if job.state.terminal and ended else job.updated_at
        duration = max(0, int((end - min(started)) * 1000))
    point: dict[str, object] | None = (
        None
        if last is None
        else {
            "attempt": last.attempt,
            "at": last.at,
            "tool_call_count": last.tool_call_count,
            "last_tool": last.last_tool,
        }
    )
    return Progress(job.state.value.lower(), point, calls, duration)
