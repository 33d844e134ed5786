"""The world watch: the engine looks at the world model once per scheduler tick and raises each
deadlock it finds — a cycle of waits among live jobs (corral.world.model) — as one incident
`deadlock` of critical severity, with the cycle in its context, and one core event `deadlock`
(`corral events --kind deadlock`). Nothing is stopped unless the role of a job waiting in the
cycle says `on_deadlock: cancel`: that job is then cancelled (with the jobs it submitted);
otherwise the jobs go on holding what they hold until an operator (or the jobs' own timeouts)
breaks the cycle.

Once per cycle: the cycle's key (its jobs, sorted) is kept here and, so a restarted engine or a
second engine on the same store does not raise it again, looked up among the open incidents of
the cycle's first job before one is written."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from corral.core.ports import BaselineStore, JobRecords, JobStore, WorldReads
from corral.domain.errors import CorralError
from corral.domain.governance import Incident, IncidentType
from corral.domain.ids import new_id
from corral.domain.models import Baseline, JobEvent
from corral.domain.settings import Settings
from corral.policy.reports import SEVERITY
from corral.world import anomaly
from corral.world.model import Caps, Deadlock, World, build

log = logging.getLogger("corral.world")

Clock = Callable[[], float]
WAIT_STARTED = "wait_started"  # a job's timeline: it follows `data.on` to its end
WAIT_ENDED = "wait_ended"  # … and stopped following it
ACTIVE_CAP = 100_000  # active jobs read per state at most
FINISHED = 100  # the latest finished jobs the causal graph shows


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    """Which jobs a snapshot shows: a tenant's (the HTTP API's token) or every one."""

    tenant: str | None = None
    finished: int = FINISHED


def caps_of(settings: Settings) -> Caps:
    return Caps(
        roles={name: r.concurrency for name, r in settings.roles.items()},
        envs={name: (e.kind, e.max_inflight) for name, e in settings.environments.items()},
    )


async def snapshot(
    store: WorldStore, settings: Settings, scope: Scope | None = None, *, clock: Clock = time.time
) -> World:
    """The world as the store shows it now, in a few reads whatever the number of jobs: the
    live jobs that can take part in an edge or a link and the latest ended ones as narrow rows,
    the queue depths counted in the store, the attempts in flight, their latest checkpoints and
    wait events, and the live targets of waits and dependencies not read yet."""
    scope = scope or Scope()
    jobs = await store.world_jobs(finished=scope.finished)
    queued = await store.world_queues(tenant=scope.tenant)
    inflight = await store.world_inflight()
    if scope.tenant is not None:
        jobs = [j for j in jobs if j.tenant == scope.tenant]
        inflight = [(j, a) for j, a in inflight if j.tenant == scope.tenant]
    checkpoints, timeline = await store.world_records([j.id for j, _ in inflight])
    by_job: dict[str, list[JobEvent]] = {}
    for e in timeline:
        by_job.setdefault(e.job_id, []).append(e)
    waits = {j.id: open_waits(by_job.get(j.id, [])) for j, _ in inflight}
    # A job waiting in the queue on its own is not read, yet it can be what another job waits
    # for, depends on or was submitted by: read those few. They point at nothing themselves
    # (no parent, no dependency pending), so one round is all it takes.
    known = {j.id for j in jobs} | {j.id for j, _ in inflight}
    wanted = {j.parent_id for j in jobs if j.parent_id is not None}
    wanted.update(d for j in jobs if j.deps_pending for d in j.after)
    wanted.update(t for ts in waits.values() for t in ts)
    missing = sorted(wanted - known)
    if missing:
        more = await store.world_sketches(missing)
        jobs = [*jobs, *(j for j in more if scope.tenant in (None, j.tenant))]
    return build(jobs, inflight, checkpoints, waits, caps_of(settings), now=clock(), queued=queued)


def open_waits(timeline: list[JobEvent]) -> set[str]:
    """The jobs a job's timeline says it is following now."""
    following: dict[str, int] = {}
    for e in timeline:
        target = e.data.get("on")
        if not isinstance(target, str):
            continue
        if e.kind == WAIT_STARTED:
            following[target] = following.get(target, 0) + 1
        elif e.kind == WAIT_ENDED:
            following[target] = following.get(target, 0) - 1
    return {t for t, n in following.items() if n > 0}


class WorldStore(JobStore, WorldReads, Protocol):
    """What a snapshot reads."""


class WatchedStore(JobRecords, BaselineStore, WorldReads, Protocol):
    """What the watch reads and writes: jobs, their records, incidents and the baselines."""


class WorldWatch:
    """Raises deadlocks and anomalies among live jobs, each once (the module says how)."""

    def __init__(
        self,
        store: WatchedStore,
        settings: Settings,
        *,
        every_s: float | None = None,
        clock: Callable[[], float] = time.time,
        stop: Callable[[str], Awaitable[None]] | None = None,
        wake: Callable[[], object] | None = None,
    ) -> None:
        self.store = store
        self.stop = stop  # stop a live attempt of this engine (limit_hit anomaly)
        self.wake = wake  # tell the dispatcher to look at the running jobs now (a cancel)
        self.flagged: set[tuple[str, int]] = set()  # (job, attempt) flagged as anomalous
        self.settings = settings
        self.every_s = every_s if every_s is not None else settings.scheduler.poll_interval_s
        self.clock = clock
        self.raised: set[str] = set()  # the keys of the cycles raised (here or found raised)

    async def run(self) -> None:
        while True:
            try:
                await self.look()
            except CorralError as err:  # the store is down: look again on the next tick
                log.warning("world watch: %s", err)
            await anyio.sleep(self.every_s)

    async def look(self) -> list[Incident]:
        """One look: the incidents raised for deadlocks and anomalies found now (none already
        raised). Nothing runs, nothing to look at: every cycle of waits passes through a running
        job (a cycle of dependencies alone is refused at submit), and so does every anomaly."""
        if not await self.store.world_inflight():
            return []
        snap = await snapshot(self.store, self.settings, Scope(finished=0))
        raised = []
        for dead in snap.deadlocks:
            if dead.key in self.raised:
                continue
            self.raised.add(dead.key)
            if await self._already(dead):
                continue
            raised.extend(await self._raise(dead))
        raised.extend(await self._anomalies(snap))
        return raised

    async def _cancel_waiter(self, dead: Deadlock, message: str, now: float) -> None:
        """Break the cycle when the role of one of its waiters says so (`on_deadlock: cancel`):
        cancel the first such waiter (its children go with it)."""
        for e in dead.edges:
            if e.kind != "waits_for":
                continue
            job = await self.store.get_job(e.source)
            spec = self.settings.roles.get(job.role)
            if spec is None or spec.on_deadlock != "cancel" or job.state.terminal:
                continue
            try:
                await self.store.request_cancel(job.id, reason=message, kind="cancel", now=now)
            except CorralError as err:  # ended meanwhile
                log.warning("deadlock: cancelling %s: %s", job.id, err)
                continue
            if self.wake is not None:
                self.wake()
            return

    async def _anomalies(self, snap: World) -> list[Incident]:
        """Live attempts past their role's factor × the median of their baselines, flagged once
        per attempt (and stopped when the role says so)."""
        if not snap.agents:
            return []
        known: dict[tuple[str, str], dict[str, Baseline]] = {}
        for b in await self.store.baselines():
            known.setdefault((b.role, b.kind), {})[b.metric] = b
        raised = []
        for a in snap.agents:
            if (a.job_id, a.attempt) in self.flagged or (a.role, a.kind) not in known:
                continue
            spec = self.settings.roles.get(a.role)
            factor = spec.anomaly.factor if spec else anomaly.DEFAULT_FACTOR
            live = {"tool_calls": float(a.tool_calls)}
            if a.started_at is not None:
                live["duration_s"] = max(0.0, snap.at - a.started_at)
            found = anomaly.check(a.job_id, a.attempt, live, known[(a.role, a.kind)], factor)
            if not found:
                continue
            self.flagged.add((a.job_id, a.attempt))
            if await self._flagged_before(a.job_id, a.attempt):
                continue
            raised.extend(await self._flag(found, stop=bool(spec and spec.anomaly.stop)))
        return raised

    async def _flagged_before(self, job_id: str, attempt: int) -> bool:
        return any(
            i.type is IncidentType.ANOMALY and i.context.get("attempt") == attempt
            for i in await self.store.open_incidents(job_id)
        )

    async def _flag(self, found: list[anomaly.Finding], *, stop: bool) -> list[Incident]:
        first = found[0]
        message = "anomaly: " + "; ".join(f.describe() for f in found)
        if stop:
            message += " (stopped: limit_hit anomaly)"
        incident = Incident(
            id=new_id(),
            report_id=None,
            job_id=first.job_id,
            type=IncidentType.ANOMALY,
            severity=SEVERITY[IncidentType.ANOMALY],
            message=message,
            created_at=self.clock(),
            context={
                "attempt": first.attempt,
                "stopped": stop,
                "findings": [
                    {
                        "metric": f.metric,
                        "value": f.value,
                        "median": f.median,
                        "factor": f.factor,
                        "samples": f.samples,
                    }
                    for f in found
                ],
            },
        )
        written = await self.store.append_incidents([incident])
        log.warning("job %s: %s", first.job_id, message)
        if stop and self.stop is not None:
            await self.stop(first.job_id)
        return written

    async def _already(self, dead: Deadlock) -> bool:
        return any(
            i.type is IncidentType.DEADLOCK and i.context.get("key") == dead.key
            for i in await self.store.open_incidents(dead.jobs[0])
        )

    async def _raise(self, dead: Deadlock) -> list[Incident]:
        now = self.clock()
        message = f"deadlock: {dead.describe()}"
        incident = Incident(
            id=new_id(),
            report_id=None,
            job_id=dead.jobs[0],
            type=IncidentType.DEADLOCK,
            severity=SEVERITY[IncidentType.DEADLOCK],
            message=message,
            created_at=now,
            context={
                "key": dead.key,
                "cycle": list(dead.jobs),
                "edges": [
                    {"job_id": e.source, "relationship": e.kind, "related_job_id": e.target}
                    | ({"slot": e.slot} if e.slot else {})
                    for e in dead.edges
                ],
            },
        )
        written = await self.store.append_incidents([incident])
        log.error("%s", message)
        await self._cancel_waiter(dead, message, now)
        await self.store.append_core_events(
            [
                {
                    "at": now,
                    "kind": "deadlock",
                    "scope": "job",
                    "name": dead.jobs[0],
                    "state": "open",
                    "severity": "critical",
                    "reason": "deadlock",
                    "message": message,
                    "data": {"incident": incident.id, "cycle": list(dead.jobs)},
                }
            ]
        )
        return written
