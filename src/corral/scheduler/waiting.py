"""Why a job is not running yet (or what it is doing), in one line: what `corral wait` and
`corral submit --wait` show while they wait. A pure function of facts gathered elsewhere
(runtime/watch.py), table-tested in tests/unit/test_waiting.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.domain.governance import Pause
from corral.domain.models import Job, JobEvent
from corral.domain.states import JobState


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitFacts:
    """What is known about a job's wait at one moment."""

    job: Job
    now: float
    engine: bool = True  # an engine serves the job's data directory (or its shared store)
    ahead: int = 0  # runnable QUEUED jobs before it in queue order
    pauses: Sequence[Pause] = ()  # active pauses whose scope covers the job
    refusal: JobEvent | None = None  # its latest timeline line, when that is permit_rejected
    # the running engine's view, when it answers: breakers by name, full roles and envs
    breakers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    full_roles: frozenset[str] = frozenset()
    full_envs: frozenset[str] = frozenset()
    data_dir: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """Where the job stands: a machine code, a line for people, and when it may change."""

    code: str  # ended, no_engine, awaiting_approval, retry_wait, starting, running,
    # dependencies, paused, breaker_open, permit_refused, at_capacity, queued
    text: str
    until: float | None = None

    @property
    def blocked(self) -> bool:
        """Something other than the queue itself holds the job back."""
        return self.code not in ("ended", "starting", "running", "queued")


def clock(at: float, now: float) -> str:
    """`22:36:40 (in 28s)`: a moment for people, local time."""
    left = at - now
    when = dt.datetime.fromtimestamp(at).strftime("%H:%M:%S")
    return f"{when} (in {_span(left)})" if left > 0 else when


def _span(seconds: float) -> str:
    s = max(0, round(seconds))
    return (
        f"{s}s"
        if s < 60
        else f"{s // 60}m{s % 60:02d}s"
        if s < 3600
        else f"{s // 3600}h{s % 3600 // 60:02d}m"
    )


def why(f: WaitFacts) -> Wait:
    """The one reason that matters most now."""
    j = f.job
    if j.state.terminal:
        return Wait(code="ended", text=j.state.value.lower().replace("_", " "))
    if not f.engine and j.state is not JobState.RUNNING:
        where = f" {f.data_dir}" if f.data_dir else " this data directory"
        return Wait(code="no_engine", text=f"no engine is serving{where}: start `corral serve`")
    if j.state is JobState.AWAITING_APPROVAL:
        return Wait(
            code="awaiting_approval",
            text=f"awaiting a human's approval: corral approvals list --job {j.id}",
        )
    if j.state is JobState.RETRY_WAIT:
        at = j.retry_at or f.now
        return Wait(
            code="retry_wait",
            until=at,
            text=f"attempt {j.attempts} of {j.limits.max_attempts} failed "
            f"({_clip(j.last_error or 'no error')}); next at {clock(at, f.now)}",
        )
    if j.state is JobState.STARTING:
        return Wait(code="starting", text=f"starting attempt {j.attempts}")
    if j.state is JobState.RUNNING:
        return Wait(code="running", text=f"running attempt {j.attempts} of {j.limits.max_attempts}")
    return _queued(f)


def _queued(f: WaitFacts) -> Wait:
    j = f.job
    if j.deps_pending:
        return Wait(
            code="dependencies",
            text=f"waiting for {j.deps_pending} job(s) it runs --after to succeed",
        )
    if f.pauses:
        p = f.pauses[0]
        scope = p.scope.value if p.target is None else f"{p.scope.value} {p.target}"
        return Wait(code="paused", text=f"paused ({scope}: {p.reason}); `corral resume` lifts it")
    refused = _refused(f)
    if refused is not None:
        return refused
    if j.role in f.full_roles or j.env_name in f.full_envs:
        what = f"role {j.role}" if j.role in f.full_roles else f"environment {j.env_name}"
        return Wait(
            code="at_capacity",
            text=f"{what} is at its concurrency cap: waits for a running job to end",
        )
    if f.ahead:
        return Wait(code="queued", text=f"queued behind {f.ahead} job(s)")
    return Wait(code="queued", text="queued: next to start")


def _refused(f: WaitFacts) -> Wait | None:
    """The core's last refusal of a permit for the job, brought up to date by the engine."""
    e = f.refusal
    if e is None:
        return None
    reason = str(e.data.get("reason") or "")
    if reason == "CIRCUIT_OPEN":
        return _breaker(f, e)
    after = e.data.get("retry_after_s")
    until = e.at + float(after) if isinstance(after, int | float) else None
    tail = f"; again at {clock(until, f.now)}" if until is not None and until > f.now else ""
    return Wait(
        code="permit_refused",
        until=until,
        text=f"the core refuses a permit ({reason}): {_clip(e.message)}{tail}",
    )


def _breaker(f: WaitFacts, e: JobEvent) -> Wait:
    name = f"worker:{f.job.worker}"
    live = f.breakers.get(name)
    if live is not None and live.get("state") == "CLOSED":
        return Wait(code="queued", text=f"breaker {name} closed again: next round starts it")
    if live is not None and live.get("state") == "HALF_OPEN":
        return Wait(
            code="breaker_open",
            text=f"breaker {name} is HALF_OPEN: one probe runs first, the rest wait for its result",
        )
    after = (live or {}).get("retry_after_s", e.data.get("retry_after_s"))
    at = f.now if live is not None else e.at
    until = at + float(after) if isinstance(after, int | float) else None
    when = f" until {clock(until, f.now)}" if until is not None else ""
    return Wait(
        code="breaker_open",
        until=until,
        text=f"breaker {name} is OPEN{when}: its worker failed; `corral breakers` shows why",
    )


def _clip(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
