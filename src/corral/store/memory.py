"""The store ports in pure Python: dicts of frozen values with the semantics of `SqlStore`.

Unit tests use it; tests/contract/test_store_contract.py runs one suite against it, SQLite and
PostgreSQL, so any difference from `corral.store.sql` is a bug here or there. What both decide
the same way is written once, in store/rules.py and store/cascade.py.

Atomicity without a lock: no operation awaits between its first read and its last write, so on
one event loop an operation runs to completion without interleaving (no `asyncio.Lock` needed).
An operation that raises part-way is rolled back from an undo journal, as a SQL transaction is.
There are no reservation leases (PostgreSQL's accelerator for several engines): one process.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from corral.core.ports import (
    UNBOUNDED,
    Admission,
    AttemptRef,
    EngineConfig,
    EventCursor,
    Finish,
    JobQuery,
    QueueFilter,
    RunRecords,
)
from corral.domain.agents import AgentEvent, Checkpoint, PolicyEvaluation
from corral.domain.epics import EpicRecord, TaskRecord, WaveRecord
from corral.domain.errors import Conflict, NotFound, StaleState
from corral.domain.ids import matches, resolve
from corral.domain.models import (
    Attempt,
    Baseline,
    Claimed,
    EngineInfo,
    Job,
    JobEvent,
    JobOptions,
    SubmitResult,
)
from corral.domain.states import AttemptState, JobState
from corral.domain.tokens import ApiToken
from corral.scheduler.dedup import on_held_key
from corral.scheduler.service import Seat, queue_full, workspace_seat
from corral.store import cascade, rules
from corral.store.epics_memory import MemoryEpics
from corral.store.governance_memory import MemoryGovernance
from corral.store.knowledge_memory import MemoryKnowledge
from corral.store.metrics_memory import MemoryMetrics
from corral.store.operator_memory import MemoryOperator
from corral.store.outbox_memory import MemoryOutbox
from corral.store.retention_memory import MemoryRetention
from corral.store.rows import ascii_lower, dumps
from corral.store.rules import (
    CORE_EVENT_FIELDS,
    STOP_STATES,
    acquired_event,
    attempt_state_for,
    check_transition,
    event_row,
    job_event,
    requeue_blocked,
    submitted_events,
)
from corral.store.tokens_memory import MemoryTokens
from corral.store.world_memory import MemoryWorld

K = TypeVar("K")
V = TypeVar("V")


def _json_copy(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep, JSON-shaped copy: what a SQL store would give back after a round trip."""
    out: dict[str, Any] = json.loads(json.dumps(dict(value), sort_keys=True))
    return out


def _options_copy(options: JobOptions) -> JobOptions:
    """Options as the SQL stores read them back: through their JSON (workers/sealing.py)."""
    return JobOptions.from_json(_json_copy(options.to_json()))


def _out(job: Job) -> Job:
    """A copy callers may not use to change the stored job (Job is frozen; its maps are not)."""
    return job.with_(env=_json_copy(job.env), options=_options_copy(job.options))


def _normalise(job: Job) -> Job:
    return job.with_(
        command=tuple(job.command),
        after=tuple(job.after),
        env=_json_copy(job.env),
        options=_options_copy(job.options),
        created_at=float(job.created_at),
        updated_at=float(job.updated_at),
        sort_at=float(job.sort_at),
    )


class MemoryStore(
    MemoryOperator,
    MemoryGovernance,
    MemoryOutbox,
    MemoryMetrics,
    MemoryTokens,
    MemoryRetention,
    MemoryWorld,
    MemoryEpics,
    MemoryKnowledge,
):
    """Every store port in memory. Every state change is a compare-and-set, as in SqlStore."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._core_events: list[dict[str, Any]] = []  # append-only, like the table
        self._agent_events: dict[tuple[str, int], AgentEvent] = {}
        self._checkpoints: list[Checkpoint] = []
        self._init_governance()  # the chained governance tables (governance_memory.py)
        self._init_knowledge()  # learnings, their history, citations (knowledge_memory.py)
        self._init_retention()  # what retention archived and kept (retention_memory.py)
        self._attempts: dict[str, Attempt] = {}  # attempt id → attempt
        self._job_attempts: dict[str, tuple[str, ...]] = {}  # job id → attempt ids, by index
        self._permits: dict[str, str] = {}  # permit id → attempt id (a permit is used once)
        self._dependents: dict[str, tuple[str, ...]] = {}  # dependency id → waiting job ids
        self._keys: dict[str, str] = {}  # idempotency key → holder job id
        self._ws_locks: dict[str, tuple[str, float]] = {}  # workspace → (holder id, acquired at)
        # job id → (workspace, waiting since, acquired at): the workspace_waits table
        self._ws_waits: dict[str, tuple[str, float, float | None]] = {}
        self._events: dict[str, list[tuple[int, JobEvent]]] = {}
        self._event_seq = 0
        self._engines: dict[str, tuple[str, int, float, float]] = {}
        self._fenced: dict[str, float] = {}  # engine id → when a peer fenced it
        self._configs: list[EngineConfig] = []
        self._cursors: dict[tuple[str, str], EventCursor] = {}  # the event_cursors table
        self._tokens: dict[str, ApiToken] = {}
        self._baselines: dict[tuple[str, str, str], Baseline] = {}
        self._epics: dict[str, EpicRecord] = {}
        self._epic_tasks: dict[str, dict[str, TaskRecord]] = {}
        self._epic_waves: dict[str, dict[int, WaveRecord]] = {}
        self._epic_lease: tuple[str, float] | None = None
        self._undo: list[Callable[[], object]] = []  # the open operation's undo journal

    async def open(self) -> None:
        """Nothing to connect to or migrate."""

    async def close(self) -> None:
        """Nothing to release."""

    # ---- the transaction discipline ------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """Undo every write of the operation if it raises (a rolled-back transaction)."""
        self._undo.clear()
        try:
            yield
        except BaseException:
            for undo in reversed(self._undo):
                undo()
            raise
        finally:
            self._undo.clear()

    def _set(self, table: dict[K, V], key: K, value: V) -> None:
        if key in table:
            old = table[key]
            self._undo.append(lambda: table.__setitem__(key, old))
        else:
            self._undo.append(lambda: table.pop(key, None))
        table[key] = value

    def _unset(self, table: dict[K, V], key: K) -> None:
        if key in table:
            old = table.pop(key)
            self._undo.append(lambda: table.__setitem__(key, old))

    def _emit(self, events: Sequence[JobEvent]) -> None:
        for e in events:
            self._event_seq += 1
            log = self._events.setdefault(e.job_id, [])
            log.append((self._event_seq, replace(e, at=float(e.at), data=_json_copy(e.data))))
            self._undo.append(log.pop)
            head = self._heads.get("job_events")
            self._append("job_events", {"id": self._event_seq, **event_row(e)})
            self._undo.append(functools.partial(self._unappend, "job_events", head))

    # ---- helpers (as in SqlStore) ----------------------------------------------------------

    def _move(self, job: Job, to: JobState, now: float, **cols: Any) -> Job:
        """Compare-and-set a job from its current state to `to`, setting extra fields."""
        check_transition(job, to)
        current = self._jobs.get(job.id)
        if current is None or current.state is not job.state:
            raise StaleState(f"job {job.id} is no longer {job.state.value}")
        moved = current.with_(state=to, updated_at=now, **cols)
        self._set(self._jobs, job.id, moved)
        return moved

    def _release(self, job: Job) -> None:
        """What a job holds until it ends: its idempotency key and its workspace."""
        if job.key and self._keys.get(job.key) == job.id:
            self._unset(self._keys, job.key)
        if job.workspace:
            if self._ws_locks.get(job.workspace, ("", 0.0))[0] == job.id:
                self._unset(self._ws_locks, job.workspace)
            wait = self._ws_waits.get(job.id)
            if wait is not None and wait[2] is None:
                self._unset(self._ws_waits, job.id)

    def _settle_dependents(self, job: Job, ended: JobState, now: float) -> None:
        """A dependency ended: count it off its dependents, or fail them if it did not succeed."""
        why = rules.dependency_failed(job, ended)
        for dep_id in self._dependents.get(job.id, ()):
            dep = self._jobs.get(dep_id)
            if dep is None or dep.state is not JobState.QUEUED:
                continue  # e.g. an earlier sibling's cascade already failed it
            if why is None:
                if dep.deps_pending > 0:
                    self._set(
                        self._jobs,
                        dep.id,
                        dep.with_(deps_pending=dep.deps_pending - 1, updated_at=now),
                    )
                continue
            self._move(dep, JobState.FAILED, now, last_error=why)
            self._emit([job_event(dep, "dependency_failed", now, why, to=JobState.FAILED)])
            self._release(dep)
            self._settle_dependents(dep, JobState.FAILED, now)

    def _end(self, job: Job, to: JobState, now: float, message: str, kind: str, **cols: Any) -> Job:
        """Move a job into a terminal state and do what every terminal path must do."""
        ended = self._move(job, to, now, **cols)
        self._emit([job_event(job, kind, now, message, to=to)])
        self._release(job)
        self._settle_dependents(job, to, now)
        stop = cascade.on_end(ended, to, message)
        if stop is not None:
            self._stop_children(ended, *stop, now)
        return ended

    def _stop_children(self, parent: Job, reason: str, kind: str, now: float) -> None:
        """Stop the jobs the parent submitted that have not ended (store/cascade.py)."""
        for child in sorted(
            (j for j in self._jobs.values() if j.parent_id == parent.id), key=lambda j: j.id
        ):
            current = self._jobs[child.id]  # an earlier sibling's cascade may have moved it
            if cascade.reaches(current):
                self._stop(current, reason, kind, now)

    def _stop(self, job: Job, reason: str, kind: str, now: float) -> Job:
        if job.state.terminal:
            raise Conflict(f"job {job.id} is already {job.state.value}; nothing to cancel")
        stopped = STOP_STATES.get(kind, JobState.CANCELLED)
        if not job.state.in_flight:
            return self._end(
                job,
                stopped,
                now,
                reason,
                kind,
                cancel_requested=reason,
                stop_kind=kind,
                last_error=reason,
            )
        if job.cancel_requested is not None:
            return job
        flagged = job.with_(cancel_requested=reason, stop_kind=kind, updated_at=now)
        self._set(self._jobs, job.id, flagged)
        self._emit([job_event(job, f"{kind}_requested", now, reason)])
        self._stop_children(flagged, *cascade.on_stop(flagged, kind, reason), now)
        return flagged

    # ---- submission ----------------------------------------------------------------------

    async def submit(
        self,
        job: Job,
        *,
        now: float,
        aging_s: float,
        admission: Admission = UNBOUNDED,
        evaluations: Sequence[PolicyEvaluation] = (),
    ) -> SubmitResult:
        with self._tx():
            result = self._submit(_normalise(job), now, admission)
            if result.created:
                await self.append_policy_evaluations(evaluations)
            return result

    def _dedup(self, job: Job, now: float) -> tuple[Job | None, str | None]:
        """Apply the job's idempotency key: (the holder to coalesce into, the superseded job)."""
        holder = self._jobs.get(self._keys.get(job.key, "")) if job.key else None
        decision = on_held_key(job, holder)
        if holder is None or decision == "new":
            return None, None
        if decision == "coalesce":
            return holder, None
        self._stop(holder, f"superseded by {job.id} (latest-wins)", "cancel", now)
        return None, holder.id

    def _submit(self, job: Job, now: float, admission: Admission) -> SubmitResult:
        # The order of SqlStore._submit: coalescing first, refusals before anything is kept.
        holder, superseded = self._dedup(job, now)
        if holder is not None:
            return SubmitResult(job=_out(holder), created=False, coalesced_on="key")
        parent = self._jobs.get(job.parent_id) if job.parent_id else None
        why = cascade.refuses_children(parent) if parent and cascade.reaches(job) else None
        if why is not None:
            raise Conflict(f"{why}: it cannot submit jobs now")
        seat = Seat.QUEUE
        if job.workspace:
            found = self._occupant(job.workspace)
            seat = workspace_seat(job, admission.workspace_policy, *(found or (None, False)))
            if seat is Seat.JOIN and found is not None:
                return SubmitResult(job=_out(found[0]), created=False, coalesced_on="workspace")
        job, failed_dep = self._resolve_deps(job)
        if job.id in self._jobs:
            raise Conflict(f"job {job.id} already exists")
        if not job.state.terminal:
            self._check_bounds(job, admission, now)
        self._set(self._jobs, job.id, job)
        events = submitted_events(job, now, superseded, failed_dep)
        if job.workspace and not job.state.terminal:
            if seat is Seat.TAKE:
                self._set(self._ws_locks, job.workspace, (job.id, now))
                events.append(acquired_event(job, now, 0.0))
            elif seat is Seat.WAIT:
                self._note_wait(job, now)
        self._emit(events)
        if job.key and not job.state.terminal:
            self._take_key(job, job.key, steal=superseded is not None)
        return SubmitResult(job=_out(job), created=True, superseded=superseded)

    # ---- queue bounds and workspaces (as corral.store.admission) -------------------------

    def _check_bounds(self, job: Job, admission: Admission, now: float) -> None:
        for bound, env in ((admission.env_max_queued, job.env_name), (admission.max_queued, None)):
            if bound is None:
                continue
            queued = sum(
                1
                for j in self._jobs.values()
                if j.state in (JobState.QUEUED, JobState.RETRY_WAIT)
                and (env is None or j.env_name == env)
            )
            if queued >= bound:
                since = now - admission.rate_window_s
                started = sum(
                    1
                    for a in self._attempts.values()
                    if a.created_at >= since
                    and (env is None or self._jobs[a.job_id].env_name == env)
                )
                raise queue_full(
                    queued=queued, bound=bound, env=env, started=started, admission=admission
                )

    def _holder(self, workspace: str) -> Job | None:
        """The workspace's lock holder, if it is still active (a stale lock holds nothing)."""
        holder_id, _ = self._ws_locks.get(workspace, ("", 0.0))
        holder = self._jobs.get(holder_id)
        return holder if holder is not None and not holder.state.terminal else None

    def _occupant(self, workspace: str) -> tuple[Job, bool] | None:
        holder = self._holder(workspace)
        if holder is not None:
            return holder, True
        active = sorted(
            (j for j in self._jobs.values() if j.workspace == workspace and not j.state.terminal),
            key=lambda j: (j.sort_at, j.id),
        )
        return (active[0], False) if active else None

    def _note_wait(self, job: Job, now: float) -> None:
        current = self._jobs.get(job.id)
        if (
            current is not None
            and current.state is JobState.QUEUED
            and current.workspace
            and job.id not in self._ws_waits
        ):
            self._set(self._ws_waits, job.id, (current.workspace, now, None))

    def _runnable_on_workspace(self, job: Job) -> bool:
        if job.workspace is None:
            return True
        if self._ws_locks.get(job.workspace, ("", 0.0))[0] == job.id:
            return True
        if self._holder(job.workspace) is not None:
            return False
        return not any(
            o.workspace == job.workspace
            and o.state is JobState.QUEUED
            and o.deps_pending == 0
            and (o.sort_at, o.id) < (job.sort_at, job.id)
            for o in self._jobs.values()
        )

    def _runnable_on_key(self, job: Job) -> bool:
        """As admission.RUNNABLE_ON_KEY: not while a job it superseded still runs."""
        return job.key is None or not any(
            o.key == job.key and o.id != job.id and o.state in (JobState.STARTING, JobState.RUNNING)
            for o in self._jobs.values()
        )

    def _acquire_for_start(self, job: Job, now: float) -> bool | None:
        """As admission.acquire_for_start: True taken now, False held already, None lost."""
        assert job.workspace is not None
        holder_id = self._ws_locks.get(job.workspace, ("", 0.0))[0]
        if holder_id == job.id:
            return False
        if self._holder(job.workspace) is not None:
            self._note_wait(job, now)
            return None
        self._set(self._ws_locks, job.workspace, (job.id, now))
        return True

    def _after_acquire(self, job: Job, now: float) -> JobEvent:
        wait = self._ws_waits.get(job.id)
        wait_ms = 0.0
        if wait is not None:
            wait_ms = max(0.0, (now - wait[1]) * 1000.0)
            self._set(self._ws_waits, job.id, (wait[0], wait[1], now))
        for other in sorted(self._jobs.values(), key=lambda j: j.id):
            if other.workspace == job.workspace and other.id != job.id:
                self._note_wait(other, now)
        return acquired_event(job, now, wait_ms)

    async def workspaces(self) -> list[tuple[str, str, float]]:
        return [(ws, holder, at) for ws, (holder, at) in sorted(self._ws_locks.items())]

    async def workspace_lock_waits(self, since: float) -> list[float]:
        done = sorted(
            (acquired, job_id, since_at)
            for job_id, (_, since_at, acquired) in self._ws_waits.items()
            if acquired is not None and acquired >= since
        )
        return [round(max(0.0, acquired - since_at) * 1000.0, 3) for acquired, _, since_at in done]

    def _take_key(self, job: Job, key: str, *, steal: bool) -> None:
        holder = self._jobs.get(self._keys.get(key, ""))
        if not steal and holder is not None and not holder.state.terminal:
            raise StaleState(f"key {key!r} taken concurrently")
        self._set(self._keys, key, job.id)

    def _resolve_deps(self, job: Job) -> tuple[Job, str | None]:
        found = {dep_id: self._jobs.get(dep_id) for dep_id in rules.dependencies(job)}
        job, pending, failed = rules.resolve_deps(job, found)
        for dep_id in pending:
            self._set(self._dependents, dep_id, (*self._dependents.get(dep_id, ()), job.id))
        return job, failed

    # ---- dispatch ------------------------------------------------------------------------

    async def reserve(
        self, *, engine_id: str, now: float, limit: int, where: QueueFilter
    ) -> list[Job]:
        runnable = [
            j
            for j in self._jobs.values()
            if j.state is JobState.QUEUED
            and j.deps_pending == 0
            and j.role not in where.exclude_roles
            and j.env_name not in where.exclude_envs
            and j.worker not in where.exclude_workers
            and self._runnable_on_workspace(j)
            and self._runnable_on_key(j)
        ]
        runnable.sort(key=lambda j: (j.sort_at, j.id))
        return [_out(j) for j in runnable[: max(limit, 0)]]

    async def start_attempts(
        self,
        claims: Sequence[Claimed],
        *,
        now: float,
        evaluations: Sequence[PolicyEvaluation] = (),
    ) -> list[Claimed]:
        won: list[Claimed] = []
        with self._tx():
            for c in claims:
                index = c.attempt.index
                current = self._jobs.get(c.job.id)
                if (
                    current is None
                    or current.state is not JobState.QUEUED
                    or current.deps_pending != 0
                    or current.attempts != index - 1
                ):
                    continue
                if c.attempt.id in self._attempts or c.attempt.permit_id in self._permits:
                    raise Conflict(f"attempt {c.attempt.id} or its permit was already used")
                took = self._acquire_for_start(current, now) if current.workspace else False
                if took is None:
                    continue  # another job holds the workspace: this claim loses
                self._set(
                    self._jobs,
                    current.id,
                    current.with_(state=JobState.STARTING, attempts=index, updated_at=now),
                )
                if took:
                    self._emit([self._after_acquire(current, now)])
                self._set(self._attempts, c.attempt.id, c.attempt)
                self._set(self._permits, c.attempt.permit_id, c.attempt.id)
                self._set(
                    self._job_attempts,
                    current.id,
                    (*self._job_attempts.get(current.id, ()), c.attempt.id),
                )
                self._emit(
                    [
                        job_event(
                            c.job,
                            "permit_granted",
                            now,
                            f"attempt {index}",
                            to=JobState.STARTING,
                            attempt=index,
                            data={"permit": c.permit.id, "deadline_at": c.permit.deadline_at},
                        )
                    ]
                )
                won.append(
                    Claimed(
                        job=c.job.with_(state=JobState.STARTING, attempts=index, updated_at=now),
                        attempt=c.attempt,
                        permit=c.permit,
                    )
                )
            await self.append_policy_evaluations(evaluations)
        return won

    async def mark_running(
        self, started: Sequence[tuple[Attempt, AttemptRef]], *, now: float
    ) -> int:
        count = 0
        with self._tx():
            for attempt, ref in started:
                row = self._attempts.get(attempt.id)
                n = (
                    row is not None
                    and row.state is AttemptState.STARTING
                    and row.engine_id == attempt.engine_id
                )  # the owner only (fencing)
                if row is None or not n:
                    continue
                self._set(
                    self._attempts,
                    row.id,
                    replace(row, state=AttemptState.RUNNING, pid=ref.pid, started_at=now),
                )
                job = self._jobs.get(attempt.job_id)
                m = job is not None and job.state is JobState.STARTING
                if job is not None and m:
                    self._set(self._jobs, job.id, job.with_(state=JobState.RUNNING, updated_at=now))
                if n and m:
                    count += 1
                    self._emit(
                        [
                            JobEvent(
                                job_id=attempt.job_id,
                                at=now,
                                kind="running",
                                from_state="STARTING",
                                to_state="RUNNING",
                                attempt=attempt.index,
                                message=ref.describe(),
                            )
                        ]
                    )
        return count

    async def finish(self, finishes: Sequence[Finish], *, now: float) -> list[Job]:
        with self._tx():
            done = [self._finish_one(f, now) for f in finishes]
        return [_out(j) for j in done if j is not None]

    def _finish_one(self, f: Finish, now: float) -> Job | None:
        r, a = f.result, f.attempt
        row = self._attempts.get(a.id)
        closed = (
            row is not None and not row.state.terminal and row.engine_id == a.engine_id
        )  # the owner only (fencing)
        if row is not None and closed:
            self._set(
                self._attempts,
                row.id,
                replace(
                    row,
                    state=attempt_state_for(r),
                    ended_at=r.ended_at or now,
                    exit_code=r.exit_code,
                    signal=r.signal,
                    outcome=r.outcome,
                    error=r.error,
                    limit_hit=r.limit_hit,
                    started_at=row.started_at if row.started_at is not None else r.started_at,
                    pid=row.pid if row.pid is not None else a.pid,
                ),
            )
        job = self._jobs.get(a.job_id)
        if not closed or job is None or not job.state.in_flight or job.attempts != a.index:
            return None  # already finished by another path (recovery, a second engine)
        cols: dict[str, Any] = {
            "exit_code": r.exit_code,
            "limit_hit": r.limit_hit,
            "last_error": f.error,
            "retry_at": f.retry_at,
        }
        self._emit(f.events)
        if f.job_state.terminal:
            return self._end(job, f.job_state, now, f.error or "", "ended", **cols)
        moved = self._move(job, f.job_state, now, **cols)
        self._emit(
            [
                job_event(
                    job,
                    "retry_scheduled",
                    now,
                    f.error or "",
                    to=f.job_state,
                    attempt=a.index,
                    data={"retry_at": f.retry_at},
                )
            ]
        )
        return moved

    async def request_cancel(self, job_id: str, *, reason: str, kind: str, now: float) -> Job:
        with self._tx():
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id}")
            return _out(self._stop(job, reason, kind, now))

    async def release_approved(self, job_id: str, *, now: float, aging_s: float) -> Job:
        with self._tx():
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(f"no job {job_id}")
            moved = self._move(job, JobState.QUEUED, now, sort_at=now + job.priority * aging_s)
            self._emit(
                [
                    JobEvent(
                        job_id=job.id,
                        at=now,
                        kind="approved",
                        message="run approved",
                        from_state=job.state.value,
                        to_state=JobState.QUEUED.value,
                    )
                ]
            )
            return _out(moved)

    async def promote_retries(self, *, now: float, aging_s: float) -> int:
        due = sorted(
            (
                j
                for j in self._jobs.values()
                if j.state is JobState.RETRY_WAIT and j.retry_at is not None and j.retry_at <= now
            ),
            key=lambda j: j.id,
        )
        with self._tx():
            for job in due:
                self._move(
                    job, JobState.QUEUED, now, sort_at=now + job.priority * aging_s, retry_at=None
                )
                self._emit(
                    [
                        JobEvent(
                            job_id=job.id,
                            at=now,
                            kind="requeued",
                            from_state="RETRY_WAIT",
                            to_state="QUEUED",
                            message=f"attempt {job.attempts + 1} queued",
                        )
                    ]
                )
        return len(due)

    async def next_retry_at(self) -> float | None:
        waits = [
            j.retry_at
            for j in self._jobs.values()
            if j.state is JobState.RETRY_WAIT and j.retry_at is not None
        ]
        return float(min(waits)) if waits else None

    async def active_runs(self, tenant: str) -> list[str]:
        return [j.id for j in self._jobs.values() if j.tenant == tenant and j.state.in_flight]

    async def inflight(self) -> list[tuple[Job, Attempt]]:
        out = []
        for job in sorted(self._jobs.values(), key=lambda j: j.id):
            if job.state.in_flight:
                current = self._current_attempt(job)
                if current is not None:
                    out.append((_out(job), current))
        return out

    def _current_attempt(self, job: Job) -> Attempt | None:
        for attempt_id in self._job_attempts.get(job.id, ()):
            attempt = self._attempts[attempt_id]
            if attempt.index == job.attempts:
                return attempt
        return None

    # ---- reads ---------------------------------------------------------------------------

    async def get_job(self, ref: str) -> Job:
        job = self._jobs.get(ref)
        if job is None:
            job = self._jobs[resolve(ref, self._jobs)]
        return _out(job)

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        def wanted(j: Job) -> bool:
            if query.state and j.state is not query.state:
                return False
            if query.role and j.role != query.role:
                return False
            if not _matches(j, query) or (
                query.parent_id is not None and j.parent_id != query.parent_id
            ):
                return False
            return not query.dead_lettered_unresolved or (
                j.state is JobState.DEAD_LETTERED and j.dlq_resolution is None
            )

        found = sorted(
            (j for j in self._jobs.values() if wanted(j)),
            key=(lambda j: (j.updated_at, j.id)) if query.ended_since is not None else _by_id,
            reverse=True,
        )
        return [_out(j) for j in found[: max(query.limit, 0)]]

    async def attempts(self, job_id: str) -> list[Attempt]:
        found = [self._attempts[a] for a in self._job_attempts.get(job_id, ())]
        return sorted(found, key=lambda a: a.index)

    async def events(self, job_id: str, *, after_id: int = 0) -> list[tuple[int, JobEvent]]:
        return [
            (i, replace(e, data=_json_copy(e.data)))
            for i, e in self._events.get(job_id, ())
            if i > after_id
        ]

    async def run_records(self, job_ids: Sequence[str]) -> list[RunRecords]:
        out = []
        for job_id in dict.fromkeys(job_ids):
            if job_id not in self._jobs:
                continue
            out.append(
                RunRecords(
                    job=await self.get_job(job_id),
                    attempts=await self.attempts(job_id),
                    agent_events=await self.agent_events(job_id),
                    evaluations=await self.policy_evaluations(job_id, limit=1 << 31),
                    attempt_ends=[
                        e for _, e in await self.events(job_id) if e.kind == "attempt_ended"
                    ],
                )
            )
        return out

    async def append_events(self, events: Sequence[JobEvent]) -> None:
        with self._tx():
            self._emit(events)

    async def append_core_events(self, events: Sequence[Mapping[str, Any]]) -> None:
        for e in events:
            self._core_events.append(
                {
                    "id": len(self._core_events) + 1,
                    **{f: e.get(f, "") for f in CORE_EVENT_FIELDS},
                    "data": _json_copy(e.get("data") or {}),
                }
            )

    async def core_events(
        self, *, kind: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        found = [dict(e) for e in self._core_events if kind in (None, e["kind"])]
        return found[-limit:]

    async def record_agent_event(self, event: AgentEvent) -> bool:
        key = (event.job_id, event.attempt)
        if key in self._agent_events:
            return False
        self._agent_events[key] = event
        return True

    async def agent_events(self, job_id: str) -> list[AgentEvent]:
        return [e for (j, _), e in sorted(self._agent_events.items()) if j == job_id]

    async def append_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._checkpoints.append(checkpoint)

    async def checkpoints(self, job_id: str) -> list[Checkpoint]:
        return [c for c in self._checkpoints if c.job_id == job_id]

    async def lane_counts(self) -> dict[tuple[str, str, str], int]:
        lanes = (JobState.QUEUED, JobState.RETRY_WAIT, JobState.STARTING, JobState.RUNNING)
        return dict(
            Counter(
                (j.role, j.env_name, j.state.value) for j in self._jobs.values() if j.state in lanes
            )
        )

    async def counts(self, tenant: str | None = None) -> dict[str, int]:
        return dict(
            Counter(j.state.value for j in self._jobs.values() if tenant in (None, j.tenant))
        )

    # ---- dead-letter queue ---------------------------------------------------------------

    def _resolve_dlq(self, job_id: str, resolution: str, now: float) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        if job.state is not JobState.DEAD_LETTERED:
            raise Conflict(f"job {job_id} is {job.state.value}, not in the dead-letter queue")
        if job.dlq_resolution is not None:
            raise Conflict(f"job {job_id} was already resolved: {job.dlq_resolution}")
        resolved = job.with_(dlq_resolution=resolution, updated_at=now)
        self._set(self._jobs, job_id, resolved)
        self._emit([job_event(job, "dlq_" + resolution.split(":")[0], now, resolution)])
        return resolved

    async def dlq_requeue(
        self, job_id: str, new_job: Job, *, now: float, admission: Admission = UNBOUNDED
    ) -> Job:
        with self._tx():
            self._resolve_dlq(job_id, f"requeued:{new_job.id}", now)
            result = self._submit(_normalise(new_job), now, admission)
            if not result.created:  # the journal undoes the resolution
                raise Conflict(requeue_blocked(job_id, new_job, result))
            return result.job

    async def dlq_purge(self, job_id: str, *, now: float) -> Job:
        with self._tx():
            return _out(self._resolve_dlq(job_id, "purged", now))

    # ---- engines -------------------------------------------------------------------------

    async def register_engine(self, engine_id: str, *, pid: int, host: str, now: float) -> None:
        if engine_id in self._engines:  # the SQL stores hit the primary key here
            raise Conflict(f"engine {engine_id} is already registered")
        self._engines[engine_id] = (host, pid, now, now)

    async def heartbeat_engine(self, engine_id: str, *, now: float) -> bool:
        if engine_id not in self._engines or engine_id in self._fenced:
            return False
        host, pid, started_at, _ = self._engines[engine_id]
        self._engines[engine_id] = (host, pid, started_at, now)
        return True

    async def engines(self) -> list[EngineInfo]:
        return [
            EngineInfo(id=eid, host=host, heartbeat_at=beat, fenced_at=self._fenced.get(eid))
            for eid, (host, _, _, beat) in sorted(self._engines.items())
        ]

    async def take_over(
        self, engine_id: str, attempts: Sequence[Attempt], *, fence: Sequence[str], now: float
    ) -> list[str]:
        taken = []
        with self._tx():
            for eid in fence:
                if eid in self._engines:
                    self._fenced.setdefault(eid, now)
            for a in attempts:
                row = self._attempts.get(a.id)
                if (
                    row is not None
                    and row.engine_id == a.engine_id
                    and row.state in (AttemptState.STARTING, AttemptState.RUNNING)
                ):
                    self._set(self._attempts, row.id, replace(row, engine_id=engine_id))
                    taken.append(a.id)
        return taken

    async def stale_engines(self, *, before: float, exclude: str) -> list[str]:
        return [
            eid
            for eid, (_, _, _, beat) in self._engines.items()
            if beat < before and eid != exclude
        ]


def _matches(j: Job, query: JobQuery) -> bool:
    """The tenant, environment, page, recency and text filters of a job query (store/sql.py's
    WHERE clauses, with the same case rule)."""
    if (query.tenant and j.tenant != query.tenant) or (
        query.env_name and j.env_name != query.env_name
    ):
        return False
    if query.ref is not None and not matches(query.ref, j.id):
        return False
    if (query.before and j.id >= query.before) or (
        query.ended_since is not None and (not j.state.terminal or j.updated_at < query.ended_since)
    ):
        return False
    if query.text:
        hay = ascii_lower(dumps(list(j.command)) + " " + (j.prompt or ""))
        return ascii_lower(query.text) in hay
    return True


def _by_id(j: Job) -> tuple[float, str]:
    return (0.0, j.id)
