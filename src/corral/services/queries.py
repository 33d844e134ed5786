"""Read models: what the edges show of jobs and their records. Each query reads the store and
returns domain values grouped for one view (a job with its attempts and timeline, a trace, a
report with its incidents …); rendering them is the edge's."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_args

import anyio

from corral.core.ports import (
    GovernanceStore,
    JobGovernance,
    JobQuery,
    JobRecords,
    JobStore,
    JobTraces,
    TraceStore,
)
from corral.domain.agents import AgentEvent, PolicyEvaluation, Verdict
from corral.domain.errors import InvalidRequest
from corral.domain.governance import Incident, RunReport, UnifiedRun
from corral.domain.models import Attempt, Job, JobEvent
from corral.trace.ids import trace_id_hex

Clock = Callable[[], float]
VERDICTS: tuple[str, ...] = get_args(Verdict)
STATS_CAP = 1_000_000  # evaluations `policy stats` (and `policy log --job`) read at most


@dataclass(frozen=True, slots=True)
class JobList:
    """Jobs, newest first, with the short form of each id (Store.short_ids) when asked for."""

    jobs: list[Job]
    short: dict[str, str] = field(default_factory=dict)


async def jobs(store: JobStore, query: JobQuery, *, short: bool = False) -> JobList:
    """The jobs a query selects (state, role, dead-lettered …)."""
    found = await store.list_jobs(query)
    return JobList(found, await store.short_ids([j.id for j in found]) if short else {})


async def job(store: JobStore, ref: str) -> Job:
    """A job by its id or a unique prefix or suffix of it."""
    return await store.get_job(ref)


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job with its attempts, its timeline and its agents' events; `trace_id`: the
    OpenTelemetry trace its spans (submit to result) are in, derived from the job id."""

    job: Job
    attempts: list[Attempt]
    timeline: list[JobEvent]
    agent_events: list[AgentEvent]
    trace_id: str = ""


async def job_detail(store: JobTraces, ref: str) -> JobDetail:
    j = await store.get_job(ref)
    return JobDetail(
        j,
        await store.attempts(j.id),
        [e for _, e in await store.events(j.id)],
        await store.agent_events(j.id),
        trace_id_hex(j.id),
    )


@dataclass(frozen=True, slots=True)
class Trace:
    """An agent job's traces: its agents' events per attempt and the policy decisions taken."""

    job: Job
    agent_events: list[AgentEvent]
    evaluations: list[PolicyEvaluation]

    def pending(self) -> list[PolicyEvaluation]:
        """The decisions of an attempt that has not written its trace yet (still running)."""
        done = {a.attempt for a in self.agent_events}
        return [e for e in self.evaluations if e.attempt not in done]


async def trace(store: JobRecords, ref: str) -> Trace:
    j = await store.get_job(ref)
    return Trace(j, await store.agent_events(j.id), await store.policy_evaluations(j.id))


@dataclass(frozen=True, slots=True)
class ReportView:
    """A job's run report (None until it is written) and the incidents attached to it."""

    job: Job
    report: RunReport | None
    incidents: list[Incident]

    def missing_because(self) -> str:
        """Why there is no report yet."""
        return (
            "it is still " + self.job.state.value
            if not self.job.state.terminal
            else "it is written within a second of the end"
        )


async def report(store: JobGovernance, ref: str) -> ReportView:
    j = await store.get_job(ref)
    return ReportView(j, await store.report(j.id), await store.incidents(j.id))


@dataclass(frozen=True, slots=True)
class IncidentList:
    incidents: list[Incident]
    short: dict[str, str] = field(default_factory=dict)


async def incidents(
    store: JobGovernance,
    *,
    job: str | None,
    open_only: bool,
    limit: int,
    short: bool = False,
    tenant: str | None = None,
) -> IncidentList:
    """Incidents (of one job when given; of one tenant's jobs when given), with their jobs'
    short ids when asked for."""
    job_id = (await store.get_job(job)).id if job else None
    found = await store.incidents(job_id, open_only=open_only, limit=limit, tenant=tenant)
    return IncidentList(found, await store.short_ids([i.job_id for i in found]) if short else {})


@dataclass(frozen=True, slots=True)
class RunList:
    runs: list[UnifiedRun]
    short: dict[str, str] = field(default_factory=dict)


async def runs(
    store: JobGovernance,
    *,
    limit: int,
    state: str | None,
    short: bool = False,
    tenant: str | None = None,
    before: str | None = None,
) -> RunList:
    """The unified read model (`v_run_unified`), newest first; of one tenant's jobs if given,
    older than the job `before` if given."""
    found = await store.run_unified(limit, state=state, tenant=tenant, before=before)
    return RunList(found, await store.short_ids([r.job_id for r in found]) if short else {})


async def workspaces(store: JobStore) -> list[tuple[str, str, float]]:
    """Locked workspaces: (workspace, holder job id, acquired at)."""
    return await store.workspaces()


async def core_events(store: TraceStore, *, kind: str | None, limit: int) -> list[dict[str, Any]]:
    """The core's recorded decisions (breaker transitions, defense stages, escalations)."""
    return await store.core_events(kind=kind, limit=limit)


# ---- policy evaluations -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyFilter:
    """Which policy evaluations to read; built by `policy_filter`, which checks the values."""

    stage: str | None = None
    verdict: str | None = None
    limit: int = 50
    since: float | None = None  # a timestamp; None: from the beginning


def policy_filter(
    *,
    stage: str | None = None,
    verdict: str | None = None,
    limit: int = 50,
    since_s: float | None = None,
    clock: Clock = time.time,
) -> PolicyFilter:
    """A checked filter: a known verdict, a positive limit, `since_s` seconds ago (≥ 0)."""
    if verdict is not None and verdict not in VERDICTS:
        raise InvalidRequest(f"--verdict must be one of {', '.join(VERDICTS)}, not {verdict!r}")
    if limit < 1:
        raise InvalidRequest(f"--limit must be at least 1, not {limit}")
    if since_s is None:
        return PolicyFilter(stage, verdict, limit, None)
    if not math.isfinite(since_s) or since_s < 0:
        raise InvalidRequest(f"--since is seconds ago (≥ 0), not {since_s}")
    return PolicyFilter(stage, verdict, limit, clock() - since_s)


async def policy_log(
    store: JobGovernance, f: PolicyFilter, *, job: str | None = None, tenant: str | None = None
) -> list[PolicyEvaluation]:
    """Policy evaluations (pre-run decisions and guardrail checks), oldest first: the latest
    `f.limit` that match, across jobs (of `tenant`'s jobs, when given) or of one job."""
    if job is None:
        return await store.recent_policy_evaluations(
            limit=f.limit, stage=f.stage, verdict=f.verdict, since=f.since, tenant=tenant
        )
    found = await store.policy_evaluations((await store.get_job(job)).id, limit=STATS_CAP)
    return [
        e
        for e in found
        if f.stage in (None, e.stage)
        and f.verdict in (None, e.verdict)
        and (f.since is None or e.at >= f.since)
    ][-f.limit :]


@dataclass(frozen=True, slots=True)
class PolicyStats:
    """How many evaluations ended how: counts by (stage, verdict, reason), sorted."""

    since: float | None
    total: int
    counts: list[tuple[tuple[str, str, str], int]]

    @property
    def capped(self) -> bool:
        """Whether the count stopped at the read bound (STATS_CAP)."""
        return self.total >= STATS_CAP


async def policy_stats(store: GovernanceStore, f: PolicyFilter) -> PolicyStats:
    found = await store.recent_policy_evaluations(limit=STATS_CAP, since=f.since)
    counts = Counter((e.stage, e.verdict, e.reason) for e in found)
    return PolicyStats(f.since, len(found), sorted(counts.items()))


async def wait_until_ended(
    store: JobStore,
    job_id: str,
    *,
    timeout_s: float,
    poll_s: float = 0.2,
    clock: Clock = time.monotonic,
) -> Job:
    """The job once it has ended, or as it is after `timeout_s` seconds (a long poll; the caller
    tells the two apart by the job's state)."""
    deadline = clock() + timeout_s
    job = await store.get_job(job_id)
    while not job.state.terminal and clock() < deadline:
        await anyio.sleep(min(poll_s, max(0.0, deadline - clock())))
        job = await store.get_job(job_id)
    return job
