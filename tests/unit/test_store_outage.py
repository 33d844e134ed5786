"""The dispatcher rides a store outage out, and takes over only the attempts of dead engines."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from corral.core.ports import AttemptRef, Finish
from corral.domain.errors import StoreBroken, StoreError
from corral.domain.ids import new_id
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, JobSpec, Permit
from corral.domain.states import AttemptState, JobState, Outcome
from corral.scheduler.dispatcher import Dispatcher, DispatchOptions
from corral.scheduler.outage import StoreHealth
from corral.store.memory import MemoryStore
from tests.unit.test_dispatcher import SETTINGS, Rig


class FlakyStore(MemoryStore):
    """Its attempt-state writes fail with a full disk `failures` times, then work again."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.tries = 0

    async def finish(self, finishes: Sequence[Finish], *, now: float) -> list[Job]:
        self.tries += 1
        if self.failures:
            self.failures -= 1
            raise StoreError("disk full: cannot write SQLite database /x/corral.db")
        return await super().finish(finishes, now=now)


def test_a_store_outage_is_ridden_out_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        rig = Rig()
        store = FlakyStore(failures=4)
        rig.store = rig.d.store = store
        rig.svc.store = store
        health = rig.d.health = StoreHealth(jitter=lambda: 0.0)
        ids = [(await rig.svc.submit(JobSpec(command=("x",)))).job.id for _ in range(3)]
        with caplog.at_level(logging.WARNING, logger="corral.store"):
            await rig.drain()
        for i in ids:
            assert (await store.get_job(i)).state is JobState.SUCCEEDED
        assert len(rig.worker.handles) == 3, "each job ran once"
        assert store.tries > 4 and not health.degraded and health.outages == 1
        text = [r.getMessage() for r in caplog.records]
        assert sum("store unavailable" in t for t in text) == 1, text
        assert sum("store answers again" in t for t in text) == 1, text

    anyio.run(main)


def test_backoff_grows_to_its_cap_and_the_outage_ends_on_an_answer() -> None:
    health = StoreHealth(clock=lambda: 50.0, jitter=lambda: 1.0)
    delays = [health.failed("x", StoreError("locked")) for _ in range(12)]
    assert delays[0] == pytest.approx(0.1) and delays[1] == pytest.approx(0.2)
    assert delays == sorted(delays) and max(delays) == 5.0
    assert health.snapshot() == {
        "degraded": True,
        "since": 50.0,
        "error": "locked",
        "failed_tries": 12,
        "outages": 1,
    }
    health.failed("y", StoreError("locked"))
    health.answered("y")
    assert health.degraded, "x still fails: the outage goes on"
    health.answered("x")
    assert health.snapshot()["degraded"] is False and health.outages == 1


def test_a_damaged_store_is_not_waited_for() -> None:
    health = StoreHealth()
    with pytest.raises(StoreBroken):
        health.failed("x", StoreBroken("SQLite database /x is damaged"))


async def _in_flight(
    store: MemoryStore, svc_job: Job, engine: str, *, deadline_at: float, attempt_dir: str
) -> Attempt:
    attempt = Attempt(
        id=new_id(),
        job_id=svc_job.id,
        index=1,
        state=AttemptState.STARTING,
        permit_id=new_id(),
        deadline_at=deadline_at,
        created_at=1000.0,
        dir=attempt_dir,
        engine_id=engine,
    )
    permit = Permit(
        id=attempt.permit_id,
        job_id=svc_job.id,
        attempt_index=1,
        issued_at=0,
        deadline_at=deadline_at,
        grace_s=1,
        granted={},
        breaker="CLOSED",
        seal="",
    )
    await store.start_attempts([Claimed(job=svc_job, attempt=attempt, permit=permit)], now=1000.0)
    await store.mark_running([(attempt, AttemptRef.local(4242))], now=1000.0)
    return attempt


def test_a_peer_takes_over_only_what_no_live_engine_looks_after(tmp_path: Path) -> None:
    async def main() -> None:
        rig = Rig()
        store = rig.store
        now = 2000.0
        for eid, host, beat in (
            ("alive", "h", now - 1),
            ("dead", "h", now - 60),
            ("far", "other", now - 60),
            ("far-late", "other", now - 60),
            ("before-me", "h", now - 1),
        ):
            await store.register_engine(eid, pid=1, host=host, now=beat)
        jobs = [(await rig.svc.submit(JobSpec(command=("x",)))).job for _ in range(5)]
        mine = tmp_path / "attempts"
        made = {
            "alive": await _in_flight(
                store, jobs[0], "alive", deadline_at=9e9, attempt_dir="/elsewhere/a"
            ),
            "dead": await _in_flight(
                store, jobs[1], "dead", deadline_at=9e9, attempt_dir="/elsewhere/b"
            ),
            "far": await _in_flight(store, jobs[2], "far", deadline_at=9e9, attempt_dir="/far/c"),
            "far-late": await _in_flight(
                store, jobs[3], "far-late", deadline_at=now - 30, attempt_dir="/far/d"
            ),
            "before-me": await _in_flight(
                store, jobs[4], "before-me", deadline_at=9e9, attempt_dir=str(mine / "j.1")
            ),
        }
        d = Dispatcher(
            store=store,
            core=rig.link,
            settings=SETTINGS,
            clock=lambda: now,
            options=DispatchOptions(
                engine_id="me", attempts_root=mine, shared=True, host="h", stale_s=15.0
            ),
        )
        async with anyio.create_task_group() as tg:
            d._tg = tg
            assert await d.recover() == 3
            tg.cancel_scope.cancel()
        owners = {eid: (await store.attempts(a.job_id))[0].engine_id for eid, a in made.items()}
        assert owners == {
            "alive": "alive",
            "dead": "me",
            "far": "far",
            "far-late": "me",
            "before-me": "me",
        }
        fenced = {e.id for e in await store.engines() if e.fenced_at is not None}
        assert fenced == {"dead", "far-late", "before-me"}
        assert not await store.heartbeat_engine("dead", now=now)
        assert await store.heartbeat_engine("alive", now=now)

    anyio.run(main)


def test_an_attempt_taken_over_from_another_host_is_lost_saying_why() -> None:
    async def main() -> None:
        rig = Rig()
        store = rig.store
        now = 2000.0
        await store.register_engine("far", pid=1, host="other", now=now - 60)
        job = (await rig.svc.submit(JobSpec(command=("x",)))).job
        attempt = await _in_flight(store, job, "far", deadline_at=now - 30, attempt_dir="/far/a")
        rig.worker.adoptable[attempt.id] = AttemptResult(
            outcome=Outcome.LOST, error="engine stopped before the process started"
        )
        rig.d = Dispatcher(
            store=store,
            core=rig.link,
            settings=SETTINGS,
            clock=lambda: now,
            jitter=lambda: 0.0,
            options=DispatchOptions(
                engine_id="me", attempts_root=Path("/mine"), shared=True, host="h"
            ),
        )
        await store.register_engine("me", pid=2, host="h", now=now)
        await rig.drain()
        first, second = await store.attempts(job.id)
        assert first.state is AttemptState.LOST and first.engine_id == "me"
        assert first.error is not None and "on other stopped heart-beating" in first.error
        assert second.state is AttemptState.SUCCEEDED
        assert (await store.get_job(job.id)).state is JobState.SUCCEEDED

    anyio.run(main)
