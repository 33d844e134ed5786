"""The dispatch loop on the memory store with scripted workers: caps, retries, stops, recovery.

Deterministic: workers are in-process objects whose attempts end when the test says so; the
loop runs in drain mode and returns when nothing is left to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from corral.core.gateway import Core
from corral.core.link import CoreLink, connect_local
from corral.core.permits import PermitGate
from corral.core.ports import AttemptRef, Finish
from corral.domain.ids import new_id
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, JobSpec, Limits, Permit
from corral.domain.settings import EnvSpec, RetryPolicy, RoleSpec, SchedulerSpec, Settings
from corral.domain.states import AttemptState, JobState, Outcome
from corral.scheduler.dispatcher import Dispatcher, DispatchOptions
from corral.services.submissions import Submissions
from corral.store.memory import MemoryStore

Script = Callable[[Job, int], AttemptResult]


class FakeHandle:
    def __init__(self, result: AttemptResult, pid: int, hold: bool) -> None:
        self.result = result
        self.ref = AttemptRef.local(pid)
        self.stopped: list[bool] = []
        self.done = anyio.Event()
        if not hold:
            self.done.set()

    async def wait(self) -> AttemptResult:
        await self.done.wait()
        if self.stopped:
            return AttemptResult(outcome=Outcome.CANCELLED, signal=15)
        return self.result

    def stop(self, *, now_kill: bool = False) -> None:
        self.stopped.append(now_kill)
        self.done.set()

    def check(self, now: float) -> None:
        pass

    def survivors(self) -> list[int]:
        return []


class FakeWorker:
    kind = "command"

    def __init__(
        self, validate: Callable[[Permit], None], script: Script, hold: bool = False
    ) -> None:
        self.validate = validate
        self.script = script
        self.hold = hold
        self.live = 0
        self.max_live = 0
        self.handles: dict[str, FakeHandle] = {}
        self.adoptable: dict[str, FakeHandle | AttemptResult] = {}

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> FakeHandle:
        self.validate(permit)
        handle = FakeHandle(
            self.script(job, attempt.index), pid=1000 + len(self.handles), hold=self.hold
        )
        self.handles[attempt.id] = handle
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        original = handle.wait

        async def wait() -> AttemptResult:
            try:
                return await original()
            finally:
                self.live -= 1

        handle.wait = wait  # type: ignore[method-assign]
        return handle

    def ready(self) -> None:
        pass

    def adopt(self, job: Job, attempt: Attempt) -> FakeHandle | AttemptResult:
        return self.adoptable[attempt.id]


def ok(job: Job, attempt: int) -> AttemptResult:
    return AttemptResult(outcome=Outcome.EXITED, exit_code=0)


SETTINGS = Settings(
    roles={
        "default": RoleSpec(
            name="default", concurrency=3, retry=RetryPolicy(base_s=0.0, cap_s=0.0)
        ),
        "solo": RoleSpec(name="solo", concurrency=1),
    },
    environments={"local": EnvSpec(name="local", max_inflight=5)},
    scheduler=SchedulerSpec(poll_interval_s=0.05),
)


class Rig:
    """A dispatcher wired to an in-process core through the real protocol messages."""

    def __init__(
        self, script: Script = ok, hold: bool = False, settings: Settings = SETTINGS
    ) -> None:
        self.store = MemoryStore()
        self.gate = PermitGate(settings)
        self.worker = FakeWorker(self.gate.validate, script, hold)
        self.core = Core(self.gate, {"command": self.worker})
        self.link = CoreLink()
        self.d = Dispatcher(
            store=self.store,
            core=self.link,
            settings=settings,
            jitter=lambda: 0.0,
            options=DispatchOptions(engine_id="e1", attempts_root=Path("/nonexistent")),
        )
        self.svc = Submissions(self.store, settings, lambda: 1000.0, frozenset({"command"}))

    async def drain(self, tg: anyio.abc.TaskGroup | None = None) -> None:
        async with anyio.create_task_group() as own:
            connect_local(self.link, self.core, tg or own, time.time)
            await self.d.run(drain=True)
            own.cancel_scope.cancel()


def build(
    script: Script = ok,
    hold: bool = False,
    settings: Settings = SETTINGS,
) -> tuple[MemoryStore, Rig, FakeWorker, Submissions]:
    rig = Rig(script, hold, settings)
    return rig.store, rig, rig.worker, rig.svc


def test_role_cap_is_never_exceeded_and_every_job_runs_once() -> None:
    async def main() -> None:
        store, d, worker, svc = build()
        ids = [(await svc.submit(JobSpec(command=("x",)))).job.id for _ in range(20)]
        await d.drain()
        assert worker.max_live <= 3
        assert len(worker.handles) == 20
        for i in ids:
            assert (await store.get_job(i)).state is JobState.SUCCEEDED

    anyio.run(main)


def test_failures_are_retried_within_the_bound_then_dead_lettered() -> None:
    def fail(job: Job, attempt: int) -> AttemptResult:
        return AttemptResult(outcome=Outcome.EXITED, exit_code=2)

    async def main() -> None:
        store, d, worker, svc = build(fail)
        j = (await svc.submit(JobSpec(command=("x",), limits=Limits(max_attempts=3)))).job
        await d.drain()
        done = await store.get_job(j.id)
        assert done.state is JobState.DEAD_LETTERED and done.attempts == 3
        assert [a.state for a in await store.attempts(j.id)] == [AttemptState.FAILED] * 3
        assert len(worker.handles) == 3

    anyio.run(main)


def test_a_cancel_reaches_the_running_attempt() -> None:
    async def main() -> None:
        store, d, worker, svc = build(hold=True)
        j = (await svc.submit(JobSpec(command=("x",)))).job
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.drain)
            while not worker.handles:
                await anyio.wait_all_tasks_blocked()
            await svc.cancel(j.id, "stop it")
            d.d.wake(stops=True)
        assert (await store.get_job(j.id)).state is JobState.CANCELLED
        assert [h.stopped for h in worker.handles.values()] == [[False]]

    anyio.run(main)


async def _mid_flight(
    store: MemoryStore, d: Rig, svc: Submissions, state: AttemptState
) -> tuple[Job, Attempt]:
    """Put a row in flight as a crashed engine would have left it (STYLE rule 9)."""
    job = (await svc.submit(JobSpec(command=("x",)))).job
    attempt = Attempt(
        id=new_id(),
        job_id=job.id,
        index=1,
        state=AttemptState.STARTING,
        permit_id="p-old",
        deadline_at=9e9,
        created_at=1000.0,
        dir="/x",
        engine_id="dead-engine",
    )
    permit = Permit(
        id="p-old",
        job_id=job.id,
        attempt_index=1,
        issued_at=0,
        deadline_at=9e9,
        grace_s=1,
        granted={},
        breaker="CLOSED",
        seal="",
    )
    await store.start_attempts([Claimed(job=job, attempt=attempt, permit=permit)], now=1000.0)
    if state is AttemptState.RUNNING:
        await store.mark_running([(attempt, AttemptRef.local(4242))], now=1000.0)
    return job, attempt


def test_recovery_collects_a_result_left_on_disk() -> None:
    async def main() -> None:
        store, d, worker, svc = build()
        job, attempt = await _mid_flight(store, d, svc, AttemptState.RUNNING)
        worker.adoptable[attempt.id] = AttemptResult(outcome=Outcome.EXITED, exit_code=0)
        await d.drain()
        assert (await store.get_job(job.id)).state is JobState.SUCCEEDED
        assert worker.handles == {}  # nothing started a second time

    anyio.run(main)


def test_recovery_re_adopts_a_live_attempt_and_waits_for_it() -> None:
    async def main() -> None:
        store, d, worker, svc = build()
        job, attempt = await _mid_flight(store, d, svc, AttemptState.STARTING)
        handle = FakeHandle(AttemptResult(outcome=Outcome.EXITED, exit_code=0), 99, hold=False)
        worker.adoptable[attempt.id] = handle
        await d.drain()
        attempts = await store.attempts(job.id)
        assert [a.state for a in attempts] == [AttemptState.SUCCEEDED]
        assert attempts[0].pid == 99
        assert d.gate.live == 0  # the adopted permit was released

    anyio.run(main)


def test_recovery_of_a_vanished_attempt_retries_it() -> None:
    async def main() -> None:
        store, d, worker, svc = build()
        job, attempt = await _mid_flight(store, d, svc, AttemptState.RUNNING)
        worker.adoptable[attempt.id] = AttemptResult(outcome=Outcome.LOST, error="vanished")
        await d.drain()
        attempts = await store.attempts(job.id)
        assert [a.state for a in attempts] == [AttemptState.LOST, AttemptState.SUCCEEDED]

    anyio.run(main)


def test_finish_is_idempotent_under_a_second_engine() -> None:
    async def main() -> None:
        store, d, _worker, svc = build()
        _job, attempt = await _mid_flight(store, d, svc, AttemptState.RUNNING)
        result = AttemptResult(outcome=Outcome.EXITED, exit_code=0)
        f = Finish(attempt=attempt, result=result, job_state=JobState.SUCCEEDED)
        assert len(await store.finish([f], now=1001.0)) == 1
        assert await store.finish([f], now=1002.0) == []

    anyio.run(main)
