"""The reporter: every terminal job gets its run report and incidents, written exactly once.

Jobs reach a terminal state on many paths (an attempt's end, an operator's cancel of a queued
job, a failed dependency, a denial at submit, a kill switch), in this engine or in another
process. Instead of hooking each path, the reporter asks the store for terminal jobs without a
report and writes them (policy/reports.py decides the content). The store refuses a second
report for a job, so two engines racing for one job write one report; a crash between a job's
end and its report is caught up on the next look.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio

from corral.core.ports import BaselineStore, JobRecords, RunReads, RunRecords
from corral.domain.agents import AgentEvent, PolicyEvaluation
from corral.domain.errors import Conflict, CorralError, NotFound
from corral.domain.governance import Incident, Pause, RunReport, ScopeKind, Severity
from corral.domain.ids import new_id
from corral.domain.models import Attempt, Job, JobEvent
from corral.domain.settings import OversightSpec
from corral.policy import prerun
from corral.policy.reports import build_report, incidents_for
from corral.runtime.flywheel import LOST_AFTER_S, Flywheel
from corral.world import anomaly

if TYPE_CHECKING:  # the OpenTelemetry SDK: imported only by an engine that exports spans
    from corral.trace.spans import JobSpans

log = logging.getLogger("corral.reporter")

LOOK_EVERY_S = 1.0
BATCH = 100


class ReportedStore(JobRecords, RunReads, Protocol):
    """What the reporter reads and writes: the jobs' records, read a batch at a time."""


@dataclass(frozen=True, slots=True)
class _Draft:
    """A job's report and incidents, built, not written yet; with what they were built from."""

    job: Job
    attempts: list[Attempt]
    events: list[AgentEvent]
    evaluations: list[PolicyEvaluation]
    report: RunReport
    incidents: list[Incident]
    now: float


class Reporter:
    def __init__(
        self,
        store: ReportedStore,
        oversight: OversightSpec | None = None,
        clock: Callable[[], float] = time.time,
        spans: JobSpans | None = None,
        baselines: BaselineStore | None = None,
        flywheel: Flywheel | None = None,
    ) -> None:
        self.store = store
        self.flywheel = flywheel  # rewards the learnings a run was given, extracts new ones
        self.baselines = baselines  # where each finished attempt's figures are learned
        self.spans = spans  # the job's OpenTelemetry spans, once its report is written
        self.oversight = oversight or OversightSpec()
        self.clock = clock
        self._wake = anyio.Event()
        self._marks: list[prerun.IncidentMark] = []  # incidents written here, by role
        # jobs whose records this engine could not read into a report (said once each)
        self._unreadable: set[str] = set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                # Approvals nobody decided in time turn into denials (the same periodic look).
                for a in await self.store.expire_approvals(self.clock()):
                    if a.subject == prerun.RUN_SUBJECT:
                        with contextlib.suppress(Conflict):  # ended meanwhile
                            await self.store.request_cancel(
                                a.job_id,
                                reason=f"approval_expired: {a.id}",
                                kind="deny",
                                now=self.clock(),
                            )
                while await self.catch_up():
                    pass
                await self.settle_lost()
            except CorralError as err:  # the store is down: try again on the next look
                log.warning("run reports: %s", err)
            with anyio.move_on_after(LOOK_EVERY_S):
                await self._wake.wait()
            self._wake = anyio.Event()

    async def flush(self) -> None:
        """Write every report that is due (an engine that drains does this before it exits)."""
        while await self._due():
            await self.catch_up()

    async def _due(self) -> list[str]:
        """Up to one batch of unreported jobs, less the ones this engine cannot read."""
        found = await self.store.unreported(BATCH + len(self._unreadable))
        return [i for i in found if i not in self._unreadable][:BATCH]

    async def catch_up(self) -> int:
        """Write the reports of up to one batch of unreported terminal jobs; how many. The
        batch's reports are written in one transaction (one commit, not one per job)."""
        ids = await self._due()
        drafts = [d for d in await self._drafts(ids) if d is not None]
        if self.flywheel is not None:
            await self.flywheel.mark_due([(d.job, d.events) for d in drafts])
        try:
            written = await self.store.record_reports([(d.report, d.incidents) for d in drafts])
        except (Conflict, NotFound):  # an incident the store refused: one by one, as before
            written = [await self._record_one(d) for d in drafts]
        for draft, report in zip(drafts, written, strict=True):
            if report is not None:
                await self._written(draft)
        return len(ids) if len(ids) == BATCH else 0

    async def write(self, job_id: str) -> None:
        """Write one job's report (and what follows it) unless it has one already."""
        found = await self.store.run_records([job_id])
        if not found:
            raise NotFound(f"no job {job_id}")
        draft = self._draft(found[0])
        if self.flywheel is not None:
            await self.flywheel.mark_due([(draft.job, draft.events)])
        if await self._record_one(draft) is not None:
            await self._written(draft)

    async def settle_lost(self) -> int:
        """Settle again the learnings of up to one batch of runs whose settle an engine lost
        (it died, or the store failed, between the run's report and the end of its settle:
        runtime/flywheel.py); how many."""
        if self.flywheel is None:
            return 0
        ids = await self.flywheel.store.settle_due(self.clock() - LOST_AFTER_S, BATCH)
        for job_id in ids:
            try:
                job = await self.store.get_job(job_id)
            except NotFound:  # gone (retention): nothing is left to settle
                await self.flywheel.store.settled(job_id)
                continue
            log.info("job %s: settling its learnings again (a settle was lost)", job_id)
            # marked again now: what stays due is tried again after LOST_AFTER_S, not at
            # every look
            await self.flywheel.store.mark_settle_due([job_id], self.clock())
            await self.flywheel.settle(job, await self.store.agent_events(job_id))
        return len(ids)

    async def _drafts(self, ids: list[str]) -> list[_Draft | None]:
        """The drafts of these jobs, from one read of their records; None for a job whose
        records this version cannot read (one job, not the engine: it gets no report)."""
        try:
            found = await self.store.run_records(ids)
        except CorralError:
            raise  # the store's trouble: the next look tries again
        except Exception:  # one job's records spoil the batch's read: find it, one by one
            if len(ids) == 1:
                log.exception("job %s: its records cannot be read; it gets no run report", ids[0])
                self._unreadable.add(ids[0])
                return [None]
            return [d for i in ids for d in await self._drafts([i])]
        drafts: list[_Draft | None] = []
        for records in found:
            try:
                drafts.append(self._draft(records))
            except Exception:
                log.exception(
                    "job %s: its records cannot be read; it gets no run report", records.job.id
                )
                self._unreadable.add(records.job.id)
                drafts.append(None)
        return drafts

    def _draft(self, r: RunRecords) -> _Draft:
        now = self.clock()
        report = build_report(
            r.job,
            r.attempts,
            r.agent_events,
            now=now,
            report_id=new_id(),
            attempt_costs=_attempt_costs(r.attempt_ends),
        )
        incidents = incidents_for(
            r.job,
            r.attempts,
            r.agent_events,
            r.evaluations,
            now=now,
            report_id=report.id,
            new_id=new_id,
        )
        return _Draft(r.job, r.attempts, r.agent_events, r.evaluations, report, incidents, now)

    async def _record_one(self, d: _Draft) -> RunReport | None:
        try:  # the report and its incidents in one transaction
            return await self.store.record_report(d.report, d.incidents)
        except Conflict:
            return None  # another engine wrote it first

    async def _written(self, d: _Draft) -> None:
        """What follows a report that won: its spans, the baselines, the oversight marks."""
        if self.spans is not None:  # exactly once per job too: after the report won
            try:
                self.spans.emit(d.job, d.attempts, d.events, d.evaluations)
            except Exception as err:
                log.warning("spans of job %s: %s", d.job.id, err)
        await self._learn(d.job, d.events, d.now)
        if self.flywheel is not None:
            await self.flywheel.settle(d.job, d.events)
        # One anomalous run is one mark, at its worst severity: a failed run that also used up
        # its retries (two incidents) must not count twice towards the pause.
        opened = [i for i in d.incidents if i.resolves is None]
        if opened:
            worst = max(opened, key=lambda i: prerun.SEVERITY_RANK[i.severity])
            self._marks.append((worst.created_at, ScopeKind.ROLE, d.job.role, worst.severity))
        await self._oversee(d.now)

    async def _learn(self, job: Job, events: list[AgentEvent], now: float) -> None:
        """Add the job's clean attempts (no error, no limit hit) to its role and kind's rolling
        baselines: what the anomaly watch compares live attempts with (runtime/worldwatch.py)."""
        if self.baselines is None:
            return
        kind = anomaly.kind_of(job)
        rows = [
            (job.role, kind, metric, value)
            for e in events
            if e.error is None and e.limit_hit is None
            for metric, value in anomaly.samples_of(e).items()
        ]
        try:
            await self.baselines.add_baseline_samples(rows, now=now, window=anomaly.WINDOW)
        except CorralError as err:  # a report without its samples: the baseline waits for more
            log.warning("baselines of job %s: %s", job.id, err)

    async def _oversee(self, now: float) -> None:
        """Human oversight: a role whose incident rate crosses the threshold stops
        getting new runs (a pause an operator lifts with `corral resume`)."""
        o = self.oversight
        if o.incident_threshold is None:
            self._marks.clear()
            return
        self._marks = [m for m in self._marks if m[0] > now - o.window_s]
        hot = prerun.should_pause(
            self._marks, now, o.window_s, o.incident_threshold, Severity(o.min_severity)
        )
        if not hot:
            return
        paused = {(p.scope, p.target) for p in await self.store.pauses(active_only=True)}
        for scope, target in hot:
            if (scope, target) in paused:
                continue
            await self.store.activate_pause(
                Pause(
                    id=new_id(),
                    scope=scope,
                    target=target,
                    created_at=now,
                    created_by="corral-oversight",
                    reason=f"incident_rate: {o.incident_threshold} incidents of severity "
                    f"≥ {o.min_severity} within {o.window_s:g} s",
                )
            )
            log.warning("paused %s %s: incident rate over the threshold", scope.value, target)
            self._marks = [m for m in self._marks if (m[1], m[2]) != (scope, target)]


def _attempt_costs(attempt_ends: list[JobEvent]) -> dict[int, float]:
    """What each attempt's worker reported it cost (a command's result file, a foreign
    scheduler's report), as its `attempt_ended` event recorded it."""
    costs: dict[int, float] = {}
    for e in attempt_ends:
        cost = e.data.get("cost_usd")
        if e.attempt is not None and isinstance(cost, int | float) and cost > 0:
            costs[e.attempt] = float(cost)
    return costs
