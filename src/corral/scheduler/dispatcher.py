"""The dispatch loop: queue → permit → attempt → result → retry, dead-letter or done.

Every background loop lives in one task group; each attempt is supervised by its own task. The
store is written in small batches (one transaction per batch of starts and one per batch of
results) so that many short attempts do not pay one commit each (bench/ W1).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from corral.core.link import CoreLink, CoreUnavailable
from corral.core.permits import Rejected
from corral.core.ports import AttemptRef, EngineRegistry, Finish, JobStore, QueueFilter
from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import CorralError, StoreError
from corral.domain.ids import new_id
from corral.domain.models import (
    Attempt,
    AttemptResult,
    Claimed,
    EngineInfo,
    Job,
    JobEvent,
    Permit,
)
from corral.domain.settings import Settings
from corral.domain.states import AttemptState, JobState, Outcome
from corral.scheduler.outage import StoreHealth
from corral.scheduler.retry import RetryInput, decide

log = logging.getLogger("corral.dispatch")

BATCH = 64  # jobs reserved per dispatch round
# Ends that stop the job's children too (store/cascade.py).
_REACHES_CHILDREN = frozenset(
    {JobState.CANCELLED, JobState.KILLED, JobState.TIMED_OUT, JobState.DENIED}
)
# An attempt the shim should have ended long ago is killed by the engine too (defence in depth).
DEADLINE_SLACK_S = 5.0


@dataclass(slots=True)
class _Live:
    claimed: Claimed
    started: bool = False  # the core reported the process running
    stop_sent: str | None = None
    limit_hit: str | None = None  # a runtime limit the governor stopped the attempt for
    lost_why: str | None = None  # taken over from another host: why it is LOST if it is


class Verdict(Protocol):
    @property
    def verdict(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


class Switch(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def reason(self) -> str: ...


class RunGate(Protocol):
    """The pre-run policy where runs begin, and the kill switch on what runs (runtime/gate.py)."""

    async def admit(self, jobs: list[Job], now: float) -> Mapping[str, Verdict]: ...

    async def to_kill(self, running: list[Job], now: float) -> Sequence[tuple[Job, Switch]]: ...

    async def settle(self, job: Job, result: AttemptResult) -> None: ...

    def stale(self) -> None: ...

    async def holds_everything(self, now: float) -> bool: ...

    def dispatched(self, job_ids: Iterable[str]) -> None: ...

    def take_allowed(self) -> list[PolicyEvaluation]: ...

    async def record(self, evaluations: list[PolicyEvaluation]) -> None: ...

    def unwritten(self, evaluations: Iterable[PolicyEvaluation]) -> None: ...


class AgentHooks(Protocol):
    """What the dispatcher tells the governor of agent attempts (runtime/governor.py)."""

    def is_agent(self, kind: str) -> bool: ...

    async def resume_session(self, claimed: Claimed) -> str | None: ...

    async def started(self, claimed: Claimed) -> None: ...

    async def ended(self, claimed: Claimed, result: AttemptResult) -> None: ...


class Knowledge(Protocol):
    """What the dispatcher asks the knowledge flywheel (runtime/flywheel.py) of an agent
    attempt about to start: the attempt with the learnings its agent is given, if any."""

    async def inject(self, claimed: Claimed) -> Claimed: ...


@dataclass(slots=True)
class _Batch:
    """Writes waiting for the next flush; each waiter is released once its write committed."""

    started: list[tuple[Attempt, AttemptRef]] = field(default_factory=list)
    finished: list[Finish] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchOptions:
    engine_id: str
    attempts_root: Path
    # Several engines share the store (PostgreSQL): only attempts of engines that stopped
    # heart-beating for `stale_s` (or that served this data directory before) are taken over,
    # and the store is looked at for them every `scan_s`. Otherwise (SQLite) this engine owns
    # every attempt in flight.
    shared: bool = False
    host: str = ""
    stale_s: float = 15.0
    scan_s: float = 5.0


class DispatchStore(JobStore, EngineRegistry, Protocol):
    """The jobs it dispatches, and the engines whose attempts it may take over."""


class Dispatcher:
    """Runs the queue against the core until cancelled (or, in drain mode, until idle)."""

    def __init__(
        self,
        *,
        store: DispatchStore,
        core: CoreLink,
        settings: Settings,
        options: DispatchOptions,
        agents: AgentHooks | None = None,
        gate: RunGate | None = None,
        knowledge: Knowledge | None = None,
        on_settled: Callable[[], None] = lambda: None,
        health: StoreHealth | None = None,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.store = store
        self.core = core  # a link: the core may live in this process or in a supervised child
        self.settings = settings
        self.opts = options
        self.agents = agents
        self.knowledge = knowledge
        self.gate = gate
        self.on_settled = on_settled  # an attempt's end is written (a job may have ended)
        self.health = health or StoreHealth(clock=clock)
        self.clock = clock
        self.jitter = jitter
        self._live: dict[str, _Live] = {}
        self._pending_stop: dict[str, str] = {}
        self._wake = anyio.Event()
        self._check_stops = True
        self._batch = _Batch()
        self._flush_wanted = anyio.Event()
        self._tg: TaskGroup | None = None
        self._retry_due: float | None = None
        self._rejected: dict[str, str] = {}  # job id → last permit refusal reason recorded
        # job id → why it is being stopped (cancel, kill switch), for its last_error: the
        # claimed job is the one read before anybody asked
        self._stop_reasons: dict[str, str] = {}
        self._rejections: list[JobEvent] = []
        self._next_scan = 0.0  # when to look for attempts whose engine died (shared store)

    # ---- public --------------------------------------------------------------------------

    def wake(self, *, stops: bool = False) -> None:
        """Something changed (a submission, a cancel, a freed slot): look at the queue now."""
        self._check_stops = self._check_stops or stops
        self._wake.set()

    @property
    def inflight(self) -> int:
        return len(self._live)

    def live_claim(self, job_id: str) -> Claimed | None:
        """The claim of the job's running attempt, with the worker kind it really runs as."""
        live = self._live.get(job_id)
        if live is None:
            return None
        c = live.claimed
        kind = c.permit.granted.get("worker") or c.job.worker
        return c if kind == c.job.worker else replace(c, job=c.job.with_(worker=kind))

    async def stop_for_limit(self, job_id: str, limit: str, grace_s: float) -> None:
        """A runtime limit was reached: stop the attempt after `grace_s` (its summary time)."""
        live = self._live.get(job_id)
        if live is None or live.limit_hit is not None:
            return
        live.limit_hit = limit
        assert self._tg is not None
        self._tg.start_soon(self._stop_later, job_id, live, grace_s)

    async def _stop_later(self, job_id: str, live: _Live, grace_s: float) -> None:
        await anyio.sleep(grace_s)
        if self._live.get(job_id) is live and live.stop_sent is None:
            await self._stop(job_id, "limit")

    async def run(self, *, drain: bool = False, ready: anyio.Event | None = None) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._writer)
            await self.health.retry("recovering attempts in flight", self.recover)
            self._retry_due = await self.health.retry("reading retries", self.store.next_retry_at)
            if ready is not None:
                ready.set()
            while True:
                self._wake = anyio.Event()
                try:
                    runnable = await self._tick()
                    if (
                        drain
                        and not runnable
                        and not self._live
                        and (await self._nothing_pending())
                    ):
                        break
                except StoreError as err:  # an outage: attempts keep running, we wait it out
                    self._check_stops = True
                    await anyio.sleep(self.health.failed("dispatching", err))
                    continue
                self.health.answered("dispatching")
                if runnable:
                    continue
                woken = False
                with anyio.move_on_after(self._idle_timeout()):
                    await self._wake.wait()
                    woken = True
                if not woken:  # the periodic look: other writers (CLI, other engines) may
                    self._check_stops = True  # have changed things without telling us
                    with contextlib.suppress(StoreError):  # the next round retries it
                        self._retry_due = await self.store.next_retry_at()
            await self._flush_now()
            tg.cancel_scope.cancel()

    # ---- the loop ------------------------------------------------------------------------

    async def _tick(self) -> bool:
        """One round; True when a full batch was dispatched and more may be waiting."""
        now = self.clock()
        if self._retry_due is not None and now >= self._retry_due:
            await self.store.promote_retries(now=now, aging_s=self.settings.scheduler.aging_s)
            self._retry_due = await self.store.next_retry_at()
        if self.opts.shared and now >= self._next_scan:  # peers die while we run, too
            self._next_scan = now + self.opts.scan_s
            await self.recover()
        if self._check_stops:
            self._check_stops = False
            if self.gate is not None:
                self.gate.stale()
            await self._apply_stops()
        if self.gate is not None:
            await self._apply_kill_switches(now)
        return await self._dispatch(now)

    async def _apply_kill_switches(self, now: float) -> None:
        assert self.gate is not None
        running = [live.claimed.job for live in self._live.values() if live.stop_sent is None]
        for job, switch in await self.gate.to_kill(running, now):
            reason = f"kill switch {switch.id}: {switch.reason}"
            with contextlib.suppress(CorralError):  # persisted first: a restart still kills it
                await self.store.request_cancel(job.id, reason=reason, kind="kill", now=now)
            self._stop_reasons[job.id] = reason
            await self._stop(job.id, "kill")
            self._check_stops = True  # its children were flagged too

    async def _nothing_pending(self) -> bool:
        counts = await self.store.counts()
        return not any(counts.get(s, 0) for s in ("QUEUED", "RETRY_WAIT", "STARTING", "RUNNING"))

    def _idle_timeout(self) -> float:
        timeout = self.settings.scheduler.poll_interval_s
        if self._retry_due is not None:
            timeout = min(timeout, max(0.0, self._retry_due - self.clock()))
        return timeout

    def _free_slots(self) -> int:
        """At most how many attempts could start now: no use reserving (and asking the core
        permits for) more jobs than the environments have room for."""
        capacity = sum(e.max_inflight for e in self.settings.environments.values())
        return max(0, min(BATCH, capacity - len(self._live)))

    async def _held(self, now: float) -> bool:
        """A global pause holds every job: the queue is not read (each submission wakes the
        dispatcher, which re-judged the same head of the queue every time). A resume pokes the
        engine, and the gate reads the pauses again at least every REFRESH_S anyway."""
        return self.gate is not None and await self.gate.holds_everything(now)

    async def _dispatch(self, now: float) -> bool:
        free = self._free_slots()
        if free == 0 or await self._held(now):
            return False
        roles_full, envs_full = self.core.saturated
        where = QueueFilter(exclude_roles=roles_full, exclude_envs=envs_full)
        jobs = await self.store.reserve(
            engine_id=self.opts.engine_id, now=now, limit=free, where=where
        )
        if self.gate is not None and jobs:
            jobs = await self._admit(jobs, now)
        # the pre-run allows go with the attempts they let in (or on their own if none starts)
        allowed = self.gate.take_allowed() if self.gate is not None else []
        claims = await self._claims(jobs, now, allowed)
        if not claims:
            return False
        won = await self._start(claims, now, allowed)
        assert self._tg is not None
        for c in won:
            self._live[c.job.id] = _Live(claimed=c)
            self._tg.start_soon(self._supervise, c, False)
        if self.gate is not None:
            self.gate.dispatched(c.job.id for c in won)
        won_ids = {c.attempt.id for c in won}
        for c in claims:
            if c.attempt.id not in won_ids:  # another engine (or a cancel) got there first
                with contextlib.suppress(CoreUnavailable):
                    await self.core.release(c.permit)
        if any(c.job.workspace for c in won):
            await self._report_lock_waits(now)
        return len(jobs) == free and bool(won)

    async def _claims(
        self, jobs: list[Job], now: float, allowed: list[PolicyEvaluation]
    ) -> list[Claimed]:
        """The jobs the core granted a permit; when none, `allowed` is written on its own."""
        claims: list[Claimed] = []
        try:
            claims = [c for c in await self._claim_all(jobs, now) if c is not None]
        except CoreUnavailable:
            pass  # the supervisor restarts the core and wakes us
        finally:
            await self._record_rejections()
        if not claims and self.gate is not None:  # no attempt to write them with
            await self.gate.record(allowed)
        return claims

    async def _start(
        self, claims: list[Claimed], now: float, allowed: list[PolicyEvaluation]
    ) -> list[Claimed]:
        """The attempts of `claims`, recorded with the pre-run allows; the claims that won."""
        try:
            return await self.store.start_attempts(claims, now=now, evaluations=allowed)
        except StoreError:
            # Nothing starts; the permits go back. Should the commit have reached the store
            # after all (its answer lost with the connection), the attempts are ours, in
            # flight and never started: `adopt_orphans` finds them and they are LOST, retried.
            if self.gate is not None:
                self.gate.unwritten(allowed)
            for c in claims:
                with contextlib.suppress(CoreUnavailable):
                    await self.core.release(c.permit)
            raise

    async def _admit(self, jobs: list[Job], now: float) -> list[Job]:
        """The jobs the pre-run policy lets start now; denied ones end DENIED, paused ones wait."""
        assert self.gate is not None
        verdicts = await self.gate.admit(jobs, now)
        admitted = []
        for job in jobs:
            v = verdicts.get(job.id)
            if v is None or v.verdict == "allow":
                admitted.append(job)
            elif v.verdict == "deny":
                with contextlib.suppress(CorralError):
                    await self.store.request_cancel(
                        job.id, reason=f"{v.reason}: {v.message}", kind="deny", now=now
                    )
        return admitted

    async def _claim_all(self, jobs: list[Job], now: float) -> list[Claimed | None]:
        """Ask the core for every permit at once (pipelined over the link), in queue order."""
        if len(jobs) == 1:
            return [await self._claim(jobs[0], now)]
        results: list[Claimed | None] = [None] * len(jobs)
        lost: list[CoreUnavailable] = []

        async def one(i: int, job: Job) -> None:
            try:
                results[i] = await self._claim(job, now)
            except CoreUnavailable as err:  # re-raised below as itself, not in a group
                lost.append(err)

        async with anyio.create_task_group() as tg:
            for i, job in enumerate(jobs):
                tg.start_soon(one, i, job)
        if lost:  # permits the departed core granted died with it: nothing to give back
            raise lost[0]
        return results

    async def _claim(self, job: Job, now: float) -> Claimed | None:
        index = job.attempts + 1
        try:
            permit = await self.core.request_permit(job, index)
        except CoreUnavailable:
            raise
        except CorralError as err:
            # The core refused the job itself: a value out of its bounds (a row written past the
            # submission checks, or before them). It never runs; the engine keeps serving.
            permit = Rejected(reason="invalid_job", message=str(err), final=True)
        if isinstance(permit, Rejected) and permit.final:  # refused for good: it never runs
            with contextlib.suppress(CorralError):
                await self.store.request_cancel(
                    job.id, reason=f"{permit.reason}: {permit.message}", kind="deny", now=now
                )
            return None
        if isinstance(permit, Rejected):
            # The job waits (it never fails for lack of a slot); the refusal is recorded once
            # per reason so a long wait does not flood its timeline.
            if self._rejected.get(job.id) != permit.reason:
                self._rejected[job.id] = permit.reason
                self._rejections.append(
                    JobEvent(
                        job_id=job.id,
                        at=now,
                        kind="permit_rejected",
                        message=permit.message,
                        attempt=index,
                        data={"reason": permit.reason, "retry_after_s": permit.retry_after_s},
                    )
                )
            return None
        self._rejected.pop(job.id, None)
        attempt = Attempt(
            id=new_id(),
            job_id=job.id,
            index=index,
            state=AttemptState.STARTING,
            permit_id=permit.id,
            deadline_at=permit.deadline_at,
            created_at=now,
            dir=str(self.opts.attempts_root / f"{job.id}.{index}"),
            engine_id=self.opts.engine_id,
        )
        return Claimed(job=job, attempt=attempt, permit=permit)

    async def _report_lock_waits(self, now: float) -> None:
        """Feed the watchdog's workspace_lock_wait_ms gauge with the waits that just ended."""
        waits = await self.store.workspace_lock_waits(now)
        if waits:
            with contextlib.suppress(CorralError):
                await self.core.control(
                    "report_metric", name="workspace_lock_wait_ms", value=max(waits)
                )

    async def _record_rejections(self) -> None:
        events, self._rejections = self._rejections, []
        if events:
            await self.store.append_events(events)
        if len(self._rejected) > 10_000:  # forget the oldest; worst case one repeated event
            for job_id in list(self._rejected)[:5_000]:
                del self._rejected[job_id]

    async def _apply_stops(self) -> None:
        for job, _attempt in await self.store.inflight():
            if not job.cancel_requested:
                continue
            live = self._live.get(job.id)
            if live is not None:
                self._stop_reasons[job.id] = job.cancel_requested
            kind = job.stop_kind or "cancel"
            if (
                job.workspace
                and job.cancel_requested.startswith("superseded by")
                and (live is None or live.stop_sent is None)
            ):
                # latest-wins churn on one workspace is something the core escalates
                with contextlib.suppress(CorralError):
                    await self.core.control("note_superseded", workspace=job.workspace)
            if live is None or not live.started:
                self._pending_stop[job.id] = kind  # not started yet: stopped right after spawn
            elif live.stop_sent is None:
                await self._stop(job.id, kind)

    async def _stop(self, job_id: str, kind: str, *, now: bool = False) -> None:
        live = self._live.get(job_id)
        if live is not None and live.stop_sent is None:
            live.stop_sent = kind
        try:
            await self.core.cancel(job_id, now=now)
        except CoreUnavailable:
            if live is not None and not now:
                live.stop_sent = None  # try again once the core is back
            self._check_stops = True

    # ---- one attempt ---------------------------------------------------------------------

    async def _supervise(self, c: Claimed, adopt: bool) -> None:
        live = self._live.setdefault(c.job.id, _Live(claimed=c))
        if (
            not adopt
            and self.agents is not None
            and self.agents.is_agent(c.permit.granted.get("worker") or c.job.worker)
        ):
            agents = self.agents
            session = await self.health.retry(
                "reading the agent's session", lambda: agents.resume_session(c)
            )
            if session:
                c = replace(c, job=c.job.with_(options=c.job.options.with_(resume_session=session)))
                live.claimed = c
            if self.knowledge is not None:  # best effort: never holds the attempt back
                c = await self.knowledge.inject(c)
                live.claimed = c
        try:
            started = await (self._adopt(c) if adopt else self.core.submit(c))
        except CoreUnavailable:
            started = None  # in limbo: the restarted core is told (readopt) and reports its end
        if isinstance(started, AttemptResult):
            await self._complete(c, started)
            return
        if started is not None:
            live.started = True
            if c.attempt.state is AttemptState.STARTING:
                await self._write(started=(c.attempt, started))
            if self.agents is not None and (claim := self.live_claim(c.job.id)) is not None:
                await self.agents.started(claim)
        kind = self._pending_stop.pop(c.job.id, None)
        if kind and live.stop_sent is None:
            await self._stop(c.job.id, kind)
        budget = c.permit.deadline_at + c.permit.grace_s + DEADLINE_SLACK_S - self.clock()
        result: AttemptResult | None = None
        with anyio.move_on_after(max(0.0, budget)):
            result = await self.core.result(c.job.id)
        if result is None:
            log.warning("attempt %s outlived its deadline; killing its tree", c.attempt.id)
            await self._stop(c.job.id, live.stop_sent or "timeout", now=True)
            result = await self.core.result(c.job.id)
        await self._complete(c, result)

    async def _adopt(self, c: Claimed) -> AttemptRef | AttemptResult:
        """Hand an attempt found in flight to the core. When the core cannot decide yet (its
        shim holds the lock but wrote no pid — a full disk — or a process of it survives), the
        attempt is neither adopted nor declared lost: it is looked at again, with backoff."""
        delay = 0.5
        while True:
            try:
                return await self.core.adopt(c.job, c.attempt)
            except CoreUnavailable:
                raise
            except CorralError as err:
                log.warning(
                    "attempt %s cannot be adopted yet (%s); looking again in %.0f s",
                    c.attempt.id,
                    err,
                    delay,
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _complete(self, c: Claimed, result: AttemptResult) -> None:
        live = self._live.get(c.job.id)
        stop_kind = (live.stop_sent if live else None) or self._pending_stop.pop(c.job.id, None)
        if stop_kind in ("timeout", "limit"):  # the engine's own stops, not an operator's
            stop_kind = None
        limit_hit = live.limit_hit if live else None
        if limit_hit:
            result = replace(result, limit_hit=limit_hit)
        if live is not None and live.lost_why and result.outcome is Outcome.LOST:
            result = replace(result, error=live.lost_why)
        if stop_kind is None and result.outcome is Outcome.CANCELLED:
            # The shim was told to stop by somebody else (an operator's kill, a previous engine
            # that died mid-cancel): trust the persisted request.
            stop_kind = c.job.stop_kind or "cancel"
        role = self.settings.roles.get(c.job.role)
        policy = role.retry if role else self.settings.roles[self.settings.default_role].retry
        now = self.clock()
        job = c.job.with_(
            attempts=c.attempt.index,
            cancel_requested=self._stop_reasons.pop(c.job.id, None) or c.job.cancel_requested,
        )
        d = decide(
            RetryInput(
                job=job,
                result=result,
                policy=policy,
                stop_kind=stop_kind,
                runtime_limit=limit_hit,
                jitter=self.jitter(),
            ),
            now,
        )
        if stop_kind == "kill" and result.outcome is Outcome.CANCELLED:
            result = replace(result, outcome=Outcome.KILLED)
        if d.limit_hit and not result.limit_hit:
            result = replace(result, limit_hit=d.limit_hit)
        if self.gate is not None:
            try:
                await self.gate.settle(c.job, result)
            except CorralError as err:
                log.error("settling the budget of %s failed: %s", c.attempt.id, err)
        if self.agents is not None:
            claim = self.live_claim(c.job.id) or c
            try:
                await self.agents.ended(claim, result)
            except Exception:  # the trace is best effort; the result is not
                log.exception("writing the agent trace of %s failed", c.attempt.id)
        fault = result.fault.value if result.fault else None
        events = [
            JobEvent(
                job_id=c.job.id,
                at=now,
                kind="attempt_ended",
                attempt=c.attempt.index,
                message=result.describe()
                + (f" ({fault} failure)" if fault and fault != "job" else ""),
                data={
                    "outcome": result.outcome.value,
                    "exit_code": result.exit_code,
                    "signal": result.signal,
                    "cost_usd": result.cost_usd,
                    "fault": fault,
                },
            )
        ]
        await self._write(
            finished=Finish(
                attempt=c.attempt,
                result=result,
                job_state=d.state,
                retry_at=d.retry_at,
                error=d.error,
                events=events,
            )
        )
        if d.retry_at is not None:
            self._retry_due = min(d.retry_at, self._retry_due or d.retry_at)
        self._live.pop(c.job.id, None)
        self.on_settled()
        # A job that ended stopped or timed out had its children flagged in the same write
        # (store/cascade.py): stop their processes now, not at the next periodic look.
        self.wake(stops=d.state in _REACHES_CHILDREN)

    # ---- recovery ------------------------------------------------------------------------

    async def recover(self) -> int:
        """Take over the attempts in flight that no live engine looks after: re-adopt those
        still running, collect those that ended, and declare lost (then retry within bounds)
        those that vanished. Each takeover moves the attempt's owner in the store (a
        compare-and-set: of two peers one wins) and fences the engine it came from, whose
        writes of the attempt's state are refused from then on."""
        assert self._tg is not None
        now = self.clock()
        found = [(j, a) for j, a in await self.store.inflight() if j.id not in self._live]
        if not found:
            return 0
        engines = {e.id: e for e in await self.store.engines()} if self.opts.shared else {}
        picked = [
            (j, a, why)
            for j, a in found
            if (why := self._orphaned(j, a, engines.get(a.engine_id), now)) is not None
        ]
        me = self.opts.engine_id
        fence = sorted({a.engine_id for _, a, _ in picked if a.engine_id != me})
        taken = set(await self.store.take_over(me, [a for _, a, _ in picked], fence=fence, now=now))
        events = []
        for job, attempt, why in picked:
            if attempt.id not in taken:
                continue  # a peer took it first
            mine = replace(attempt, engine_id=me)
            c = Claimed(job=job, attempt=mine, permit=_adopted_permit(job, mine))
            owner = engines.get(attempt.engine_id)
            far = self.opts.shared and (owner is None or owner.host != self.opts.host)
            self._live[job.id] = _Live(claimed=c, lost_why=why if far else None)
            self._tg.start_soon(self._supervise, c, True)
            events.append(
                JobEvent(
                    job_id=job.id,
                    at=now,
                    kind="recovered",
                    attempt=attempt.index,
                    message=why,
                    data={"from_engine": attempt.engine_id, "engine": me},
                )
            )
        if events:
            with contextlib.suppress(StoreError):  # the timeline line is not worth a retry
                await self.store.append_events(events)
        return len(events)

    def _orphaned(self, job: Job, a: Attempt, owner: EngineInfo | None, now: float) -> str | None:
        """Why this engine takes the attempt over, or None when it must leave it alone."""
        if a.engine_id == self.opts.engine_id:  # our start committed, its answer got lost
            return "found in flight after a store outage; handed back to the core"
        if not self.opts.shared:  # we hold the data directory: its attempts are ours
            return "handed back to the core after an engine restart"
        here = owner is not None and owner.host == self.opts.host
        if here and _under(a.dir, self.opts.attempts_root):
            # an earlier engine of this data directory (we hold its lock: it is gone)
            return f"engine {a.engine_id} served this data directory before; taken over at restart"
        if (
            owner is not None
            and owner.fenced_at is None
            and (owner.heartbeat_at >= now - self.opts.stale_s)
        ):
            return None  # its engine is alive
        if here:  # its shim, its lock and its result are on this host: adopt or collect
            return f"engine {a.engine_id} stopped heart-beating; taken over by a peer"
        # Another host: nothing of it can be seen from here. Once past its deadline its shim
        # has stopped it, so a retry cannot run beside it.
        if now > a.deadline_at + job.limits.grace_s + DEADLINE_SLACK_S:
            where = owner.host if owner is not None else "an unknown host"
            return (
                f"engine {a.engine_id} on {where} stopped heart-beating and the attempt's "
                "deadline has passed; its end cannot be seen from here"
            )
        return None

    async def core_restarted(self) -> None:
        """A new core process: tell it about every attempt we still wait on."""
        for live in list(self._live.values()):
            c = live.claimed
            with contextlib.suppress(CoreUnavailable, CorralError):
                await self.core.readopt(c.job, c.attempt, c.permit.granted.get("worker"))
            if live.stop_sent:
                live.stop_sent = None
                self._pending_stop[c.job.id] = c.job.stop_kind or "cancel"
        self.wake(stops=True)

    # ---- batched writes ------------------------------------------------------------------

    async def _write(
        self, *, started: tuple[Attempt, AttemptRef] | None = None, finished: Finish | None = None
    ) -> None:
        batch = self._batch
        if started is not None:
            batch.started.append(started)
        if finished is not None:
            batch.finished.append(finished)
        self._flush_wanted.set()
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    async def _writer(self) -> None:
        while True:
            await self._flush_wanted.wait()
            # One turn of the event loop first: the attempts whose start or end is already on
            # its way (a result read, a start answered) join this batch instead of the next
            # transaction. W1 wrote 4.4 transactions per job without it, 3.7 with it; waiting
            # for more turns while the batch grew gave nothing more (bench/README.md, "Group
            # commit in the dispatcher").
            await anyio.lowlevel.checkpoint()
            await self._flush_now()

    async def _flush_now(self) -> None:
        batch, self._batch = self._batch, _Batch()
        self._flush_wanted = anyio.Event()
        if not (batch.started or batch.finished):
            batch.done.set()
            return
        try:
            now = self.clock()
            # An attempt that started and ended within one flush goes straight to its end
            # (STARTING → terminal is an edge of the lifecycle), its pid written with the end:
            # one write less per short job.
            pids = dict((a.id, ref.pid) for a, ref in batch.started)
            finished = [
                replace(f, attempt=replace(f.attempt, pid=pids[f.attempt.id]))
                if f.attempt.id in pids
                else f
                for f in batch.finished
            ]
            ending = {f.attempt.id for f in finished}
            started = [s for s in batch.started if s[0].id not in ending]
            # An outage is waited out: the write is tried again until the store answers (the
            # attempts keep running meanwhile; their waiters wait). Both writes are idempotent
            # compare-and-sets, so a batch is simply written again. Only the wait between two
            # tries may be cancelled (the engine stops: the next one collects the results).
            while True:
                try:
                    with anyio.CancelScope(shield=True):  # a decided result is always written
                        if started:
                            await self.store.mark_running(started, now=now)
                        if finished:
                            await self.store.finish(finished, now=now)
                except StoreError as err:
                    await anyio.sleep(self.health.failed("writing attempt states", err))
                    continue
                self.health.answered("writing attempt states")
                break
        except Exception as err:  # not the store being away: every waiter sees the error
            log.error("store write failed: %s", err)
            batch.error = err
        finally:
            batch.done.set()


def _under(attempt_dir: str, root: Path) -> bool:
    return Path(attempt_dir).resolve().parent == root.resolve()


def _adopted_permit(job: Job, attempt: Attempt) -> Permit:
    """The scheduler's view of a recovered attempt's permit (the core re-registers the real one;
    this copy only carries the deadline and grace the dispatcher's backstop uses)."""
    return Permit(
        id=attempt.permit_id,
        job_id=job.id,
        attempt_index=attempt.index,
        issued_at=attempt.created_at,
        deadline_at=attempt.deadline_at,
        grace_s=job.limits.grace_s,
        granted={},
        breaker="",
        seal="",
    )
