"""The store contract for admission: queue bounds (backpressure) and workspace locks.

Runs on the memory, SQLite and PostgreSQL stores like test_store_contract.py, with its helpers and
fixed fake clock. "Queued" is QUEUED or RETRY_WAIT; workspace policies are in
docs/reference/config.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from corral.cli.exits import exit_code
from corral.core.ports import Admission, AttemptRef, QueueFilter, Store
from corral.domain.errors import Backpressure, Conflict
from corral.domain.models import Claimed, Job, Limits
from corral.domain.settings import WorkspacePolicy
from corral.domain.states import DedupMode, JobState, Outcome
from tests.contract.test_store_contract import (
    AGING,
    NOW,
    UseStore,
    claim,
    ending,
    kinds,
    make_job,
    reservable,
)

REJECT = Admission(workspace_policy=WorkspacePolicy.REJECT)
COALESCE = Admission(workspace_policy=WorkspacePolicy.COALESCE)
SERIALIZE = Admission(workspace_policy=WorkspacePolicy.SERIALIZE)
WS = "/repos/corral"


async def put(
    store: Store, admission: Admission = SERIALIZE, *, now: float = NOW, **overrides: Any
) -> Job:
    result = await store.submit(make_job(**overrides), now=now, aging_s=AGING, admission=admission)
    assert result.created
    return result.job


async def start_at(store: Store, job: Job, now: float = NOW, *, pid: int = 4242) -> Claimed:
    """Claim the job's next attempt at `now` and mark it RUNNING."""
    current = await store.get_job(job.id)
    won = await store.start_attempts([claim(current, now=now)], now=now)
    assert len(won) == 1, f"claim of {job.id} lost"
    assert await store.mark_running([(won[0].attempt, AttemptRef.local(pid))], now=now) == 1
    return won[0]


async def finish(store: Store, c: Claimed, state: JobState, now: float = NOW + 3, **kw: Any) -> Job:
    moved = await store.finish([ending(c.attempt, state, **kw)], now=now)
    assert [j.id for j in moved] == [c.job.id]
    return await store.get_job(c.job.id)


async def holders(store: Store) -> dict[str, str]:
    return {ws: holder for ws, holder, _ in await store.workspaces()}


# ---- queue bounds ----------------------------------------------------------------------------


def test_past_the_global_bound_a_submission_is_refused_and_writes_nothing(
    use_store: UseStore,
) -> None:
    bound = Admission(max_queued=3)

    async def body(store: Store) -> None:
        first = await put(store, bound)
        for _ in range(2):
            await put(store, bound)
        with pytest.raises(Backpressure) as err:
            await put(store, bound)
        assert err.value.retry_after_s == 5.0  # nothing started lately: the fallback
        assert exit_code(err.value) == 75
        assert str(err.value) == (
            "queue full: 3 jobs queued (max 3, scheduler.max_queued); retry after 5 s"
        )
        assert await store.counts() == {"QUEUED": 3}
        # starting a job frees a slot; RETRY_WAIT counts as queued again
        c = await start_at(store, first)
        fourth = await put(store, bound)
        await finish(store, c, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW + 100)
        with pytest.raises(Backpressure, match="queue full: 4 jobs queued"):
            await put(store, bound)
        await store.request_cancel(first.id, reason="x", kind="cancel", now=NOW)
        with pytest.raises(Backpressure):
            await put(store, bound)
        await store.request_cancel(fourth.id, reason="x", kind="cancel", now=NOW)
        await put(store, bound)
        assert await store.counts() == {"QUEUED": 3, "CANCELLED": 2}
        assert await store.submit(make_job(), now=NOW, aging_s=AGING)  # unbounded by default

    use_store(body)


def test_retry_after_is_estimated_from_recent_starts(use_store: UseStore) -> None:
    bound = Admission(max_queued=2, retry_after_s=7.0)

    async def body(store: Store) -> None:
        jobs = [await put(store) for _ in range(8)]
        for job in jobs[:6]:  # 6 starts in the last minute: one every 10 s
            await start_at(store, job, NOW - 30)
        with pytest.raises(Backpressure) as err:
            await put(store, bound)
        assert err.value.retry_after_s == 10.0
        assert "retry after 10 s" in str(err.value)
        # starts older than the window do not count: back to the configured fallback
        with pytest.raises(Backpressure) as err:
            await put(store, bound, now=NOW + 31)
        assert err.value.retry_after_s == 7.0

    use_store(body)


def test_coalesced_submissions_pass_a_full_queue(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        keyed = await put(store, key="k")
        ws_holder = await put(store, COALESCE, workspace=WS)
        full = Admission(max_queued=2, workspace_policy=WorkspacePolicy.COALESCE)
        with pytest.raises(Backpressure):
            await put(store, full)
        again = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING, admission=full)
        assert not again.created and again.job.id == keyed.id and again.coalesced_on == "key"
        joined = await store.submit(make_job(workspace=WS), now=NOW, aging_s=AGING, admission=full)
        assert not joined.created and joined.job.id == ws_holder.id
        assert joined.coalesced_on == "workspace"
        # latest-wins over a queued holder leaves the queue as long as it was
        newer = await store.submit(
            make_job(key="k", dedup=DedupMode.LATEST_WINS), now=NOW, aging_s=AGING, admission=full
        )
        assert newer.created and newer.superseded == keyed.id
        # a job that fails at once (its dependency failed) is not queued, so not refused
        await store.request_cancel(newer.job.id, reason="x", kind="cancel", now=NOW)
        await put(store, full)
        doomed = await put(store, full, after=(newer.job.id,))
        assert doomed.state is JobState.FAILED
        assert await store.counts() == {"QUEUED": 2, "CANCELLED": 2, "FAILED": 1}

    use_store(body)


def test_environment_bound_counts_its_own_environment_only(use_store: UseStore) -> None:
    gpu = Admission(max_queued=100, env_max_queued=2)

    async def body(store: Store) -> None:
        await put(store, gpu, env_name="gpu")
        for _ in range(3):
            await put(store, Admission(max_queued=100), env_name="local")
        await put(store, gpu, env_name="gpu")
        with pytest.raises(Backpressure) as err:
            await put(store, gpu, env_name="gpu")
        assert str(err.value) == (
            "queue full: 2 jobs queued in environment gpu "
            "(max 2, environments.gpu.max_queued); retry after 5 s"
        )
        await put(store, Admission(max_queued=100, env_max_queued=2), env_name="cpu")
        # the global bound counts every environment
        with pytest.raises(Backpressure, match=r"queue full: 6 jobs queued \(max 6, sched"):
            await put(store, Admission(max_queued=6), env_name="cpu")
        assert await store.counts() == {"QUEUED": 6}

    use_store(body)


def test_dlq_requeue_is_refused_when_full_and_stays_unresolved(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        dead = await put(store, limits=Limits(max_attempts=1))
        c = await start_at(store, dead)
        await finish(store, c, JobState.DEAD_LETTERED, exit_code=1)
        await put(store)
        with pytest.raises(Backpressure):
            await store.dlq_requeue(dead.id, make_job(), now=NOW, admission=Admission(max_queued=1))
        assert (await store.get_job(dead.id)).dlq_resolution is None
        assert await store.counts() == {"DEAD_LETTERED": 1, "QUEUED": 1}

    use_store(body)


# ---- workspace policies ------------------------------------------------------------------------


def test_reject_names_the_holder_and_writes_nothing(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        holder = await put(store, REJECT, workspace=WS)
        assert await store.workspaces() == [(WS, holder.id, NOW)]  # taken at submission
        assert await kinds(store, holder.id) == ["submitted", "workspace_lock_acquired"]
        with pytest.raises(Conflict) as err:
            await put(store, REJECT, workspace=WS)
        assert exit_code(err.value) == 5
        assert str(err.value) == (
            f"workspace {WS} is held by job {holder.id} (QUEUED); "
            "role default has workspace_policy reject"
        )
        assert await store.counts() == {"QUEUED": 1}
        other = await put(store, REJECT, workspace="/repos/other")
        # a queued serialize job occupies its workspace too, before it holds the lock
        waiting = await put(store, SERIALIZE, workspace="/repos/third")
        with pytest.raises(Conflict, match=waiting.id):
            await put(store, REJECT, workspace="/repos/third")
        c = await start_at(store, holder)
        await finish(store, c, JobState.SUCCEEDED)
        assert await holders(store) == {"/repos/other": other.id}
        assert (await put(store, REJECT, workspace=WS)).state is JobState.QUEUED

    use_store(body)


def test_coalesce_returns_the_holder(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        holder = await put(store, COALESCE, workspace=WS)
        c = await start_at(store, holder)
        again = await store.submit(
            make_job(workspace=WS), now=NOW, aging_s=AGING, admission=COALESCE
        )
        assert not again.created and again.job.id == holder.id
        assert again.job.state is JobState.RUNNING
        await finish(store, c, JobState.FAILED, exit_code=2)
        fresh = await store.submit(
            make_job(workspace=WS), now=NOW, aging_s=AGING, admission=COALESCE
        )
        assert fresh.created and await holders(store) == {WS: fresh.job.id}

    use_store(body)


def test_serialize_runs_one_at_a_time_in_queue_order(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        low = await put(store, workspace=WS, priority=4)
        elsewhere = await put(store, workspace="/repos/other")
        high = await put(store, workspace=WS, priority=0)
        mid = await put(store, workspace=WS, priority=2)
        plain = await put(store)
        # only the first job of a free workspace, in queue order, is runnable
        assert await reservable(store) == [high.id, elsewhere.id, plain.id]
        assert await store.workspaces() == []  # serialize takes the lock when it starts
        c = await start_at(store, high)
        assert await holders(store) == {WS: high.id}
        assert await reservable(store) == [elsewhere.id, plain.id]
        assert await store.start_attempts([claim(mid)], now=NOW) == []  # held: the claim loses
        await finish(store, c, JobState.SUCCEEDED)
        assert await store.workspaces() == []
        assert await reservable(store) == [elsewhere.id, mid.id, plain.id]
        c = await start_at(store, mid)
        await finish(store, c, JobState.SUCCEEDED)
        assert await reservable(store) == [elsewhere.id, plain.id, low.id]

    use_store(body)


def test_two_claims_on_one_free_workspace_one_wins(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = await put(store, workspace=WS)
        second = await put(store, workspace=WS)
        won = await store.start_attempts([claim(first), claim(second)], now=NOW)
        assert [w.job.id for w in won] == [first.id]
        assert (await store.get_job(second.id)).state is JobState.QUEUED
        assert await store.attempts(second.id) == []
        assert await holders(store) == {WS: first.id}
        # a claim that loses its compare-and-set does not keep the lock it took
        third = await put(store, workspace="/repos/x")
        stale = claim(third, index=2)
        assert await store.start_attempts([stale], now=NOW) == []
        assert await holders(store) == {WS: first.id}

    use_store(body)


Ending = Callable[[Store, Job], Any]


async def _succeed(store: Store, job: Job) -> None:
    await finish(store, await start_at(store, job), JobState.SUCCEEDED)


async def _fail(store: Store, job: Job) -> None:
    await finish(store, await start_at(store, job), JobState.FAILED, exit_code=2)


async def _dead_letter(store: Store, job: Job) -> None:
    await finish(store, await start_at(store, job), JobState.DEAD_LETTERED, exit_code=1)


async def _time_out(store: Store, job: Job) -> None:
    await finish(
        store,
        await start_at(store, job),
        JobState.TIMED_OUT,
        exit_code=None,
        outcome=Outcome.TIMED_OUT,
    )


async def _cancel_queued(store: Store, job: Job) -> None:
    await store.request_cancel(job.id, reason="operator", kind="cancel", now=NOW)


async def _cancel_running(store: Store, job: Job) -> None:
    c = await start_at(store, job)
    await store.request_cancel(job.id, reason="operator", kind="cancel", now=NOW)
    assert await holders(store) == {WS: job.id}  # held until the process is gone
    await finish(store, c, JobState.CANCELLED, exit_code=None, outcome=Outcome.CANCELLED)


async def _kill_in_retry_wait(store: Store, job: Job) -> None:
    c = await start_at(store, job)
    await finish(store, c, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW + 50)
    assert await holders(store) == {WS: job.id}
    await store.request_cancel(job.id, reason="kill switch", kind="kill", now=NOW)


@pytest.mark.parametrize(
    "end_it",
    [
        _succeed,
        _fail,
        _dead_letter,
        _time_out,
        _cancel_queued,
        _cancel_running,
        _kill_in_retry_wait,
    ],
)
@pytest.mark.parametrize("policy", [WorkspacePolicy.REJECT, WorkspacePolicy.SERIALIZE])
def test_every_terminal_path_releases_the_workspace(
    use_store: UseStore, end_it: Ending, policy: WorkspacePolicy
) -> None:
    async def body(store: Store) -> None:
        holder = await put(store, Admission(workspace_policy=policy), workspace=WS)
        waiting = await put(store, workspace=WS)
        await end_it(store, holder)
        assert (await store.get_job(holder.id)).state.terminal
        assert await store.workspaces() == []
        assert await reservable(store) == [waiting.id]
        await start_at(store, waiting)
        assert await holders(store) == {WS: waiting.id}

    use_store(body)


def test_held_through_retry_wait_and_the_retry_keeps_it(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await put(store, workspace=WS)
        later = await put(store, workspace=WS)
        c = await start_at(store, job)
        await finish(store, c, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW + 10)
        assert await holders(store) == {WS: job.id}
        assert await reservable(store) == []
        assert await store.promote_retries(now=NOW + 10, aging_s=AGING) == 1
        # requeued behind `later` in sort order, yet it holds the lock: it runs first
        assert await reservable(store) == [job.id]
        second = await start_at(store, job, NOW + 11)
        assert second.attempt.index == 2
        assert (await kinds(store, job.id)).count("workspace_lock_acquired") == 1
        await finish(store, second, JobState.SUCCEEDED)
        assert await reservable(store) == [later.id]

    use_store(body)


def test_dependency_failure_releases_a_workspace_taken_at_submission(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        dep = await put(store)
        holder = await put(store, REJECT, workspace=WS, after=(dep.id,))
        assert await holders(store) == {WS: holder.id}
        await _fail(store, dep)
        assert (await store.get_job(holder.id)).state is JobState.FAILED
        assert await store.workspaces() == []
        assert (await put(store, REJECT, workspace=WS)).state is JobState.QUEUED

    use_store(body)


def test_lock_waits_are_measured(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = await put(store, workspace=WS)
        queued_early = await put(store, workspace=WS)  # free workspace: not waiting yet
        c = await start_at(store, first, NOW + 10)  # its wait starts here
        submitted_late = await put(store, workspace=WS, now=NOW + 12)  # held: waits from now
        await finish(store, c, JobState.SUCCEEDED, now=NOW + 20)
        c2 = await start_at(store, queued_early, NOW + 25)
        await finish(store, c2, JobState.SUCCEEDED, now=NOW + 30)
        await start_at(store, submitted_late, NOW + 40)
        acquired = [
            (e.job_id, e.data)
            for j in (first, queued_early, submitted_late)
            for _, e in await store.events(j.id)
            if e.kind == "workspace_lock_acquired"
        ]
        assert acquired == [
            (first.id, {"workspace": WS, "wait_ms": 0.0}),
            (queued_early.id, {"workspace": WS, "wait_ms": 15000.0}),
            (submitted_late.id, {"workspace": WS, "wait_ms": 28000.0}),
        ]
        assert await store.workspace_lock_waits(NOW) == [15000.0, 28000.0]
        assert await store.workspace_lock_waits(NOW + 30) == [28000.0]
        assert await store.workspace_lock_waits(NOW + 41) == []
        assert await store.workspaces() == [(WS, submitted_late.id, NOW + 40)]

    use_store(body)


def test_a_stopping_holder_is_neither_coalesced_into_nor_a_reason_to_reject(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        old = await put(store, COALESCE, workspace=WS, key="k", dedup=DedupMode.LATEST_WINS)
        c = await start_at(store, old)
        for admission in (COALESCE, REJECT):
            result = await store.submit(
                make_job(workspace=WS, key="k", dedup=DedupMode.LATEST_WINS),
                now=NOW,
                aging_s=AGING,
                admission=admission,
            )
            assert result.created and result.superseded is not None
        newest = result.job
        assert await holders(store) == {WS: old.id}  # the old process still runs
        assert await reservable(store) == []
        await finish(store, c, JobState.CANCELLED, exit_code=None, outcome=Outcome.CANCELLED)
        assert await reservable(store) == [newest.id]

    use_store(body)


# ---- several engines on one PostgreSQL database --------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_concurrent_submissions_respect_bound_and_reject(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def attempt(store: Store, admission: Admission, **kw: Any) -> str:
        try:
            await store.submit(make_job(**kw), now=NOW, aging_s=AGING, admission=admission)
        except Backpressure:
            return "full"
        except Conflict:
            return "conflict"
        return "created"

    async def main() -> None:
        stores = [new_store() for _ in range(4)]
        for s in stores:
            await s.open()
        try:
            bounded = Admission(max_queued=5)
            results = await asyncio.gather(*(attempt(s, bounded) for _ in range(6) for s in stores))
            assert results.count("created") == 5 and results.count("full") == 19
            rejects = await asyncio.gather(
                *(attempt(s, REJECT, workspace=WS) for _ in range(3) for s in stores)
            )
            assert rejects.count("created") == 1 and rejects.count("conflict") == 11
            assert len(await stores[0].workspaces()) == 1
            claims = [
                claim(j)
                for j in await stores[0].reserve(
                    engine_id="e", now=NOW, limit=100, where=QueueFilter()
                )
                if j.workspace
            ]
            assert len(claims) == 1
        finally:
            for s in stores:
                await s.close()

    asyncio.run(main())
