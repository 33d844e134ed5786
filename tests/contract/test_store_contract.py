"""The store contract: one suite, run against the memory, SQLite and PostgreSQL stores.

Every test hands an async body to `use_store` (conftest.py). Time is a fixed fake clock (`NOW`);
nothing sleeps. Jobs are built with `make_job` and claims with `claim` (a permit is just data here).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from corral.core.ports import (
    Admission,
    AttemptRef,
    EngineConfig,
    Finish,
    JobQuery,
    QueueFilter,
    Store,
)
from corral.domain.agents import AgentEvent, Checkpoint, PolicyEvaluation, ToolCallTrace
from corral.domain.errors import Backpressure, Conflict, DuplicateJob, InvalidRequest, NotFound
from corral.domain.ids import new_id
from corral.domain.models import (
    DEFAULT_PRIORITY,
    Attempt,
    AttemptResult,
    Claimed,
    Job,
    JobEvent,
    JobOptions,
    Limits,
    Permit,
)
from corral.domain.states import AttemptState, DedupMode, JobState, Outcome

UseStore = Callable[[Callable[[Store], Awaitable[None]]], None]  # the conftest fixture
NOW = 1_700_000_000.0
AGING = 60.0


@asynccontextmanager
async def opened(*stores: Store) -> AsyncIterator[tuple[Store, ...]]:
    """Open several stores on one database (several engines), and close them all after."""
    for store in stores:
        await store.open()
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


_clock = itertools.count(1)


def make_job(**overrides: Any) -> Job:
    """A QUEUED job; each call is one fake second later than the last (ids and FIFO order)."""
    at = overrides.pop("at", NOW + next(_clock))
    priority = overrides.get("priority", DEFAULT_PRIORITY)
    fields: dict[str, Any] = {
        "id": new_id(int(at * 1000)),
        "state": JobState.QUEUED,
        "role": "default",
        "worker": "process",
        "env_name": "local",
        "priority": priority,
        "tenant": "default",
        "command": ("echo", "hi"),
        "prompt": None,
        "cwd": None,
        "env": {},
        "options": JobOptions(),
        "limits": Limits(),
        "key": None,
        "dedup": DedupMode.COALESCE,
        "workspace": None,
        "parent_id": None,
        "depth": 0,
        "created_at": at,
        "updated_at": at,
        "sort_at": at + priority * AGING,
    }
    fields.update(overrides)
    return Job(**fields)


def claim(
    job: Job, *, index: int | None = None, engine: str = "engine-1", now: float = NOW
) -> Claimed:
    """A claim for the job's next attempt (or `index`), with a permit that is only data."""
    idx = job.attempts + 1 if index is None else index
    permit_id = new_id()
    attempt = Attempt(
        id=new_id(),
        job_id=job.id,
        index=idx,
        state=AttemptState.STARTING,
        permit_id=permit_id,
        deadline_at=now + 3600,
        created_at=now,
        dir=f"/tmp/corral/{job.id}/{idx}",
        engine_id=engine,
    )
    permit = Permit(
        id=permit_id,
        job_id=job.id,
        attempt_index=idx,
        issued_at=now,
        deadline_at=now + 3600,
        grace_s=10.0,
        granted={"role": job.role},
        breaker="closed",
        seal="not-a-real-seal",
    )
    return Claimed(job=job, attempt=attempt, permit=permit)


def ending(
    attempt: Attempt,
    state: JobState,
    *,
    exit_code: int | None = 0,
    outcome: Outcome = Outcome.EXITED,
    retry_at: float | None = None,
    error: str | None = None,
    events: tuple[JobEvent, ...] = (),
) -> Finish:
    result = AttemptResult(
        outcome=outcome, exit_code=exit_code, started_at=NOW + 1, ended_at=NOW + 2
    )
    return Finish(
        attempt=attempt,
        result=result,
        job_state=state,
        retry_at=retry_at,
        error=error,
        events=events,
    )


async def submit(store: Store, **overrides: Any) -> Job:
    return (await store.submit(make_job(**overrides), now=NOW, aging_s=AGING)).job


async def start(store: Store, job: Job, *, pid: int | None = 4242) -> Claimed:
    """Claim the job's next attempt (and mark it RUNNING when `pid` is given)."""
    current = await store.get_job(job.id)
    won = await store.start_attempts([claim(current)], now=NOW)
    assert len(won) == 1, f"claim of {job.id} lost"
    if pid is not None:
        assert await store.mark_running([(won[0].attempt, AttemptRef.local(pid))], now=NOW) == 1
    return won[0]


async def end(store: Store, job: Job, state: JobState, **kw: Any) -> Job:
    """Run the job's next attempt and finish it into `state`."""
    c = await start(store, job)
    moved = await store.finish([ending(c.attempt, state, **kw)], now=NOW + 3)
    assert [j.id for j in moved] == [job.id]
    return await store.get_job(job.id)


async def kinds(store: Store, job_id: str) -> list[str]:
    return [e.kind for _, e in await store.events(job_id)]


async def reservable(store: Store, where: QueueFilter | None = None) -> list[str]:
    jobs = await store.reserve(
        engine_id="engine-1", now=NOW, limit=100, where=where or QueueFilter()
    )
    return [j.id for j in jobs]


# ---- submission and reads ------------------------------------------------------------------


def test_list_jobs_by_tenant_environment_page_recency_and_text(use_store: UseStore) -> None:
    """The dashboard's filters, answered by the store: one tenant's jobs, one environment's,
    the page after a cursor, those that ended since a time, and a case-blind (ASCII) substring of
    the command or the prompt, with LIKE's wildcards taken literally; counts of one tenant, and
    the jobs waiting per role and environment."""

    async def body(store: Store) -> None:
        a = await submit(store, tenant="acme", command=("echo", "Needle_1"), env_name="gpu")
        b = await submit(store, tenant="acme", prompt="find the NEEDLE%")
        c = await submit(store, tenant="globex", command=("echo", "needle"))

        async def ids(**kw: Any) -> list[str]:
            return [j.id for j in await store.list_jobs(JobQuery(**kw))]

        assert await ids(tenant="acme") == [b.id, a.id]
        assert await ids(env_name="gpu") == [a.id]
        assert await ids(before=c.id) == [b.id, a.id]
        assert await ids(before=b.id, tenant="acme") == [a.id]
        assert await ids(text="needle") == [c.id, b.id, a.id]
        assert await ids(text="NEEDLE_") == [a.id]  # `_` is no wildcard
        assert await ids(text="needle%") == [b.id]  # nor is `%`
        assert await ids(text="needle", tenant="globex") == [c.id]
        assert await ids(text="haystack") == []
        assert await ids(ended_since=NOW) == []
        assert await store.lane_counts() == {
            ("default", "gpu", "QUEUED"): 1,
            ("default", "local", "QUEUED"): 2,
        }
        await store.request_cancel(a.id, reason="no", kind="cancel", now=NOW + 50)
        await store.request_cancel(b.id, reason="no", kind="cancel", now=NOW + 60)
        assert await ids(ended_since=NOW + 55) == [b.id]
        assert await ids(ended_since=NOW) == [b.id, a.id]
        assert await store.counts("acme") == {"CANCELLED": 2}
        assert await store.counts("nobody") == {}
        assert await store.lane_counts() == {("default", "local", "QUEUED"): 1}

    use_store(body)


def test_submit_get_list_and_counts(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        # `n` is a key this version does not know: kept as read, written back unchanged
        options = JobOptions.from_json({"model": "x", "n": [1, 2]})
        job = make_job(
            role="coder",
            env={"A": "1"},
            options=options,
            prompt="fix it",
            cwd="/src",
            limits=Limits(max_attempts=2, timeout_s=5),
        )
        result = await store.submit(job, now=NOW, aging_s=AGING)
        assert result.created and result.superseded is None
        assert result.job == job
        assert await store.get_job(job.id) == job
        other = await submit(store, role="reviewer")
        third = await submit(store, role="coder")
        assert [j.id for j in await store.list_jobs(JobQuery())] == [third.id, other.id, job.id]
        assert [j.id for j in await store.list_jobs(JobQuery(role="coder"))] == [third.id, job.id]
        assert [j.id for j in await store.list_jobs(JobQuery(limit=1))] == [third.id]
        await store.request_cancel(other.id, reason="no", kind="cancel", now=NOW)
        assert [j.id for j in await store.list_jobs(JobQuery(state=JobState.CANCELLED))] == [
            other.id
        ]
        assert await store.counts() == {"QUEUED": 2, "CANCELLED": 1}
        assert await kinds(store, job.id) == ["submitted"]

    use_store(body)


def test_get_job_by_unique_prefix(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        a = await submit(store)
        b = await submit(store)
        assert (await store.get_job(a.id[:-1])).id == a.id
        assert (await store.get_job(b.id[:-1])).id == b.id
        common = next(i for i, (x, y) in enumerate(zip(a.id, b.id, strict=True)) if x != y)
        assert common >= 4
        with pytest.raises(InvalidRequest, match="ambiguous"):
            await store.get_job(a.id[:common])
        with pytest.raises(NotFound):
            await store.get_job(a.id[:3])  # too short to be a prefix
        with pytest.raises(NotFound):
            await store.get_job("zzzzzzzz")
        for wildcard in ("%%%%", "____", a.id[:6] + "%"):  # user input is not a pattern
            with pytest.raises(NotFound):
                await store.get_job(wildcard)

    use_store(body)


def test_get_job_by_unique_suffix_and_the_short_form_tables_print(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        a = await submit(store)
        fill = "b" if a.id[-9] != "b" else "c"  # so that b ends like a in exactly 8 chars
        b = await submit(store, id=a.id[:12] + fill * 6 + a.id[-8:])
        c = await submit(store)
        assert (await store.get_job(a.id[-9:])).id == a.id
        assert (await store.get_job(c.id[-6:])).id == c.id
        names = ", ".join(sorted((a.id, b.id)))
        with pytest.raises(InvalidRequest, match=f"ambiguous: it names {names}"):
            await store.get_job(a.id[-8:])
        short = await store.short_ids([a.id, b.id, c.id])
        assert short == {a.id: a.id[-9:], b.id: b.id[-9:], c.id: c.id[-6:]}
        for job_id, form in short.items():  # what a table prints names the job again
            assert (await store.get_job(form)).id == job_id
        assert await store.short_ids([]) == {}

    use_store(body)


def test_queue_order_is_fifo_within_priority_and_by_priority(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        normal1 = await submit(store, priority=2)
        normal2 = await submit(store, priority=2)
        critical1 = await submit(store, priority=0)
        backlog = await submit(store, priority=4)
        critical2 = await submit(store, priority=0)
        expected = [critical1.id, critical2.id, normal1.id, normal2.id, backlog.id]
        assert await reservable(store) == expected
        top = await store.reserve(engine_id="engine-1", now=NOW, limit=2, where=QueueFilter())
        assert [j.id for j in top] == expected[:2]
        # aging: an old backlog job sorts before a new critical one once its sort_at is earlier
        late = await submit(store, priority=0, at=NOW + 10_000)
        assert (await reservable(store))[-1] == late.id

    use_store(body)


def test_queue_filter_exclusions(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        coder = await submit(store, role="coder")
        remote = await submit(store, env_name="remote")
        ray = await submit(store, worker="ray")
        plain = await submit(store)
        everything = [coder.id, remote.id, ray.id, plain.id]
        assert await reservable(store) == everything
        assert await reservable(store, QueueFilter(exclude_roles=frozenset({"coder"}))) == [
            remote.id,
            ray.id,
            plain.id,
        ]
        assert await reservable(store, QueueFilter(exclude_envs=frozenset({"remote"}))) == [
            coder.id,
            ray.id,
            plain.id,
        ]
        assert await reservable(store, QueueFilter(exclude_workers=frozenset({"ray"}))) == [
            coder.id,
            remote.id,
            plain.id,
        ]
        assert await reservable(
            store,
            QueueFilter(
                exclude_roles=frozenset({"coder", "x"}),
                exclude_envs=frozenset({"remote"}),
                exclude_workers=frozenset({"ray"}),
            ),
        ) == [plain.id]
        await start(store, plain)  # not QUEUED any more
        waiting = await submit(store, after=(coder.id,))  # deps pending
        assert waiting.deps_pending == 1
        assert await reservable(store) == [coder.id, remote.id, ray.id]

    use_store(body)


# ---- the lifecycle -------------------------------------------------------------------------


def test_happy_path(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.register_engine("engine-1", pid=1, host="here", now=NOW)
        await store.heartbeat_engine("engine-1", now=NOW + 1)
        job = await submit(store)
        [reserved] = await store.reserve(
            engine_id="engine-1", now=NOW, limit=10, where=QueueFilter()
        )
        assert reserved == job
        c = claim(reserved)
        [won] = await store.start_attempts([c], now=NOW + 1)
        assert won.job.state is JobState.STARTING and won.job.attempts == 1
        assert won.attempt == c.attempt and won.permit == c.permit
        assert (await store.get_job(job.id)).state is JobState.STARTING
        assert await store.mark_running([(c.attempt, AttemptRef.local(777))], now=NOW + 2) == 1
        [(running, live)] = await store.inflight()
        assert running.state is JobState.RUNNING and live.pid == 777
        assert live.state is AttemptState.RUNNING and live.started_at == NOW + 2
        note = JobEvent(
            job_id=job.id,
            at=NOW + 3,
            kind="report",
            message="wrote report",
            data={"path": "/r.json"},
        )
        [moved] = await store.finish(
            [ending(c.attempt, JobState.SUCCEEDED, events=(note,))], now=NOW + 4
        )
        assert moved.state is JobState.SUCCEEDED and moved.exit_code == 0
        stored = await store.get_job(job.id)
        assert moved == stored
        assert stored.attempts == 1 and stored.exit_code == 0 and stored.updated_at == NOW + 4
        [attempt] = await store.attempts(job.id)
        assert attempt.state is AttemptState.SUCCEEDED and attempt.exit_code == 0
        assert attempt.outcome is Outcome.EXITED and attempt.pid == 777
        assert attempt.started_at == NOW + 2 and attempt.ended_at == NOW + 2
        assert attempt.permit_id == c.permit.id and attempt.index == 1
        assert await store.inflight() == []
        events = [e for _, e in await store.events(job.id)]
        assert [e.kind for e in events] == [
            "submitted",
            "permit_granted",
            "running",
            "report",
            "ended",
        ]
        assert [(e.from_state, e.to_state) for e in events] == [
            (None, "QUEUED"),
            ("QUEUED", "STARTING"),
            ("STARTING", "RUNNING"),
            (None, None),
            ("RUNNING", "SUCCEEDED"),
        ]
        assert events[1].attempt == 1 and events[1].data["permit"] == c.permit.id
        assert events[3].data == {"path": "/r.json"}
        assert await store.counts() == {"SUCCEEDED": 1}

    use_store(body)


def test_start_attempts_is_compare_and_set(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        first, second = claim(job), claim(job)
        won = await store.start_attempts([first, second], now=NOW)
        assert [w.attempt.id for w in won] == [first.attempt.id]
        assert await store.start_attempts([claim(job)], now=NOW) == []
        assert [a.id for a in await store.attempts(job.id)] == [first.attempt.id]
        # a stale attempt index loses, the right one wins
        other = await submit(store)
        assert await store.start_attempts([claim(other, index=2)], now=NOW) == []
        assert await store.start_attempts([claim(other, index=0)], now=NOW) == []
        assert len(await store.start_attempts([claim(other, index=1)], now=NOW)) == 1
        assert (await store.get_job(other.id)).attempts == 1
        # mark_running only moves a STARTING attempt once
        assert await store.mark_running([(first.attempt, AttemptRef.local(1))], now=NOW) == 1
        assert await store.mark_running([(first.attempt, AttemptRef.local(2))], now=NOW) == 0
        assert (await store.attempts(job.id))[0].pid == 1
        assert (await kinds(store, job.id)).count("running") == 1

    use_store(body)


def test_finish_twice_closes_once(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        c = await start(store, job)
        assert len(await store.finish([ending(c.attempt, JobState.SUCCEEDED)], now=NOW)) == 1
        again = ending(c.attempt, JobState.FAILED, exit_code=3, error="late")
        assert await store.finish([again], now=NOW + 9) == []
        stored = await store.get_job(job.id)
        assert stored.state is JobState.SUCCEEDED and stored.exit_code == 0
        [attempt] = await store.attempts(job.id)
        assert attempt.state is AttemptState.SUCCEEDED and attempt.exit_code == 0
        assert (await kinds(store, job.id)).count("ended") == 1
        # both in one batch: the first closes it, the second is skipped
        other = await submit(store)
        c2 = await start(store, other)
        batch = [
            ending(c2.attempt, JobState.SUCCEEDED),
            ending(c2.attempt, JobState.FAILED, exit_code=1),
        ]
        assert [j.state for j in await store.finish(batch, now=NOW)] == [JobState.SUCCEEDED]

    use_store(body)


def test_no_path_moves_a_terminal_job(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        c = await start(store, job)
        done = await end_attempt(store, c, JobState.FAILED, exit_code=1, error="boom")
        assert done.state is JobState.FAILED and done.last_error == "boom"
        for kind in ("cancel", "kill"):
            with pytest.raises(Conflict, match="already FAILED"):
                await store.request_cancel(job.id, reason="late", kind=kind, now=NOW)
        assert await store.start_attempts([claim(done)], now=NOW) == []
        assert await store.mark_running([(c.attempt, AttemptRef.local(9))], now=NOW) == 0
        assert await store.finish([ending(c.attempt, JobState.SUCCEEDED)], now=NOW) == []
        assert await store.promote_retries(now=NOW + 10**6, aging_s=AGING) == 0
        assert await store.get_job(job.id) == done

    use_store(body)


async def end_attempt(store: Store, c: Claimed, state: JobState, **kw: Any) -> Job:
    moved = await store.finish([ending(c.attempt, state, **kw)], now=NOW + 3)
    assert len(moved) == 1
    assert moved[0] == await store.get_job(c.job.id)
    return moved[0]


def test_retry_wait_then_promote_then_second_attempt(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store, priority=1)
        first = await start(store, job)
        waiting = await end_attempt(
            store,
            first,
            JobState.RETRY_WAIT,
            exit_code=1,
            retry_at=NOW + 30,
            error="exited with code 1",
        )
        assert waiting.state is JobState.RETRY_WAIT and waiting.retry_at == NOW + 30
        assert waiting.exit_code == 1 and waiting.last_error == "exited with code 1"
        assert await store.next_retry_at() == NOW + 30
        assert await reservable(store) == []
        assert await store.start_attempts([claim(waiting)], now=NOW) == []
        assert await store.promote_retries(now=NOW + 29, aging_s=AGING) == 0
        assert await store.promote_retries(now=NOW + 30, aging_s=AGING) == 1
        queued = await store.get_job(job.id)
        assert queued.state is JobState.QUEUED and queued.retry_at is None
        assert queued.sort_at == NOW + 30 + 1 * AGING and queued.attempts == 1
        assert await store.next_retry_at() is None
        assert await reservable(store) == [job.id]
        assert await store.start_attempts([claim(queued, index=1)], now=NOW) == []
        second = await start(store, queued)
        assert second.attempt.index == 2
        await end_attempt(store, second, JobState.SUCCEEDED)
        attempts = await store.attempts(job.id)
        assert [(a.index, a.state) for a in attempts] == [
            (1, AttemptState.FAILED),
            (2, AttemptState.SUCCEEDED),
        ]
        assert (await store.get_job(job.id)).attempts == 2
        assert await kinds(store, job.id) == [
            "submitted",
            "permit_granted",
            "running",
            "retry_scheduled",
            "requeued",
            "permit_granted",
            "running",
            "ended",
        ]

    use_store(body)


# ---- idempotency keys ----------------------------------------------------------------------


def test_coalesce_returns_the_holder(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING)
        second = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING)
        assert first.created and not second.created
        assert second.job.id == first.job.id
        assert await store.counts() == {"QUEUED": 1}

    use_store(body)


def test_reject_names_the_holder(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        holder = await submit(store, key="k", dedup=DedupMode.REJECT)
        with pytest.raises(DuplicateJob) as err:
            await submit(store, key="k", dedup=DedupMode.REJECT)
        assert err.value.job_id == holder.id and holder.id in str(err.value)
        assert await store.counts() == {"QUEUED": 1}

    use_store(body)


def test_latest_wins_cancels_a_queued_holder_and_takes_the_key(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        old = await submit(store, key="k", dedup=DedupMode.LATEST_WINS)
        result = await store.submit(
            make_job(key="k", dedup=DedupMode.LATEST_WINS), now=NOW, aging_s=AGING
        )
        assert result.created and result.superseded == old.id
        cancelled = await store.get_job(old.id)
        assert cancelled.state is JobState.CANCELLED
        assert cancelled.cancel_requested == f"superseded by {result.job.id} (latest-wins)"
        assert await reservable(store) == [result.job.id]
        # the key now belongs to the new job
        again = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING)
        assert not again.created and again.job.id == result.job.id
        newest = await store.submit(
            make_job(key="k", dedup=DedupMode.LATEST_WINS), now=NOW, aging_s=AGING
        )
        assert newest.superseded == result.job.id
        assert (await store.get_job(result.job.id)).state is JobState.CANCELLED

    use_store(body)


def test_latest_wins_flags_a_running_holder_and_moves_the_key(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        old = await submit(store, key="k", dedup=DedupMode.LATEST_WINS)
        c = await start(store, old)
        result = await store.submit(
            make_job(key="k", dedup=DedupMode.LATEST_WINS), now=NOW, aging_s=AGING
        )
        assert result.superseded == old.id
        flagged = await store.get_job(old.id)
        assert flagged.state is JobState.RUNNING and flagged.stop_kind == "cancel"
        assert flagged.cancel_requested == f"superseded by {result.job.id} (latest-wins)"
        [(live, _)] = await store.inflight()
        assert live.cancel_requested == flagged.cancel_requested
        assert "cancel_requested" in await kinds(store, old.id)
        coalesced = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING)
        assert coalesced.job.id == result.job.id
        other = await submit(store, key="other-key")
        assert await reservable(store) == [other.id], "not beside the job it superseded"
        # the old job ending does not release the key it no longer holds
        await end_attempt(store, c, JobState.CANCELLED, exit_code=None, outcome=Outcome.CANCELLED)
        assert sorted(await reservable(store)) == sorted([result.job.id, other.id])
        coalesced = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING)
        assert coalesced.job.id == result.job.id and not coalesced.created

    use_store(body)


def test_key_held_in_retry_wait_and_released_when_terminal(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        for final in (
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.DEAD_LETTERED,
            JobState.TIMED_OUT,
        ):
            key = f"key-{final.value}"
            job = await submit(store, key=key)
            c = await start(store, job)
            await end_attempt(store, c, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW)
            held = await store.submit(make_job(key=key), now=NOW, aging_s=AGING)
            assert not held.created and held.job.id == job.id  # held during RETRY_WAIT
            if final is JobState.CANCELLED:
                await store.request_cancel(job.id, reason="stop", kind="cancel", now=NOW)
            else:
                await store.promote_retries(now=NOW, aging_s=AGING)
                await end(store, job, final, exit_code=0 if final is JobState.SUCCEEDED else 1)
            assert (await store.get_job(job.id)).state is final
            fresh = await store.submit(make_job(key=key), now=NOW, aging_s=AGING)
            assert fresh.created and fresh.job.id != job.id, final
            reject = make_job(key=key, dedup=DedupMode.REJECT)
            with pytest.raises(DuplicateJob):
                await store.submit(reject, now=NOW, aging_s=AGING)

    use_store(body)


def test_failed_submission_changes_nothing(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        holder = await submit(store, key="k", dedup=DedupMode.LATEST_WINS)
        with pytest.raises(NotFound, match="--after"):
            await submit(store, key="k", dedup=DedupMode.LATEST_WINS, after=("nope",))
        with pytest.raises(InvalidRequest, match="supersedes"):
            await submit(store, key="k", dedup=DedupMode.LATEST_WINS, after=(holder.id,))
        assert (await store.get_job(holder.id)).state is JobState.QUEUED
        assert await store.counts() == {"QUEUED": 1}
        assert await kinds(store, holder.id) == ["submitted"]
        again = await store.submit(make_job(key="k"), now=NOW, aging_s=AGING)
        assert again.job.id == holder.id

    use_store(body)


# ---- dependencies --------------------------------------------------------------------------


def test_dependent_waits_for_success(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        dep = await submit(store)
        child = await submit(store, after=(dep.id,))
        assert child.state is JobState.QUEUED and child.deps_pending == 1
        assert await reservable(store) == [dep.id]
        assert await store.start_attempts([claim(child)], now=NOW) == []
        await end(store, dep, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW)
        assert (await store.get_job(child.id)).deps_pending == 1  # not settled yet
        await store.promote_retries(now=NOW, aging_s=AGING)
        await end(store, dep, JobState.SUCCEEDED)
        assert (await store.get_job(child.id)).deps_pending == 0
        assert await reservable(store) == [child.id]
        # --after an already succeeded job: nothing to wait for; a repeated id counts once
        late = await submit(store, after=(dep.id,))
        assert late.deps_pending == 0
        twice = await submit(store, after=(child.id, child.id))
        assert twice.deps_pending == 1
        await end(store, child, JobState.SUCCEEDED)
        assert (await store.get_job(twice.id)).deps_pending == 0

    use_store(body)


def test_failed_dependency_fails_dependents_transitively(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        root = await submit(store)
        child = await submit(store, after=(root.id,), key="child-key")
        grandchild = await submit(store, after=(child.id,))
        bystander = await submit(store)
        await end(store, root, JobState.FAILED, exit_code=2)
        failed_child = await store.get_job(child.id)
        assert failed_child.state is JobState.FAILED
        assert failed_child.last_error == f"dependency {root.id} ended FAILED"
        failed_grandchild = await store.get_job(grandchild.id)
        assert failed_grandchild.state is JobState.FAILED
        assert failed_grandchild.last_error == f"dependency {child.id} ended FAILED"
        assert await kinds(store, grandchild.id) == ["submitted", "dependency_failed"]
        assert (await store.get_job(bystander.id)).state is JobState.QUEUED
        assert (await store.submit(make_job(key="child-key"), now=NOW, aging_s=AGING)).created

    use_store(body)


def test_diamond_dependencies_fail_once_each(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        root = await submit(store)
        left = await submit(store, after=(root.id,))
        join = await submit(store, after=(root.id, left.id))
        tail = await submit(store, after=(join.id,))
        cancelled = await store.request_cancel(root.id, reason="stop", kind="cancel", now=NOW)
        assert cancelled.state is JobState.CANCELLED
        for job in (left, join, tail):
            stored = await store.get_job(job.id)
            assert stored.state is JobState.FAILED, job.id
            assert (await kinds(store, job.id)).count("dependency_failed") == 1
        assert (await store.get_job(left.id)).last_error == (
            f"dependency {root.id} ended CANCELLED"
        )

    use_store(body)


def test_after_a_finished_failure_or_unknown_job(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        gone = await submit(store)
        await store.request_cancel(gone.id, reason="x", kind="kill", now=NOW)
        result = await store.submit(make_job(after=(gone.id,), key="kk"), now=NOW, aging_s=AGING)
        assert result.created and result.job.state is JobState.FAILED
        assert result.job.last_error == f"dependency {gone.id} ended KILLED"
        assert await store.get_job(result.job.id) == result.job
        assert await kinds(store, result.job.id) == ["submitted", "dependency_failed"]
        assert await reservable(store) == []
        assert (await store.submit(make_job(key="kk"), now=NOW, aging_s=AGING)).created
        with pytest.raises(NotFound):
            await submit(store, after=("01hzzzzzzzzzzzzzzzzzzzzzzz",))
        selfish = make_job()
        with pytest.raises(InvalidRequest):
            await store.submit(selfish.with_(after=(selfish.id,)), now=NOW, aging_s=AGING)
        assert await store.counts() == {"KILLED": 1, "FAILED": 1, "QUEUED": 1}

    use_store(body)


# ---- cancellation --------------------------------------------------------------------------


def test_cancel_queued_and_retry_wait_jobs_at_once(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        for kind, state in (("cancel", JobState.CANCELLED), ("kill", JobState.KILLED)):
            job = await submit(store)
            stopped = await store.request_cancel(job.id, reason="operator", kind=kind, now=NOW + 5)
            assert stopped.state is state and stopped.stop_kind == kind
            assert stopped.cancel_requested == "operator" and stopped.last_error == "operator"
            assert stopped == await store.get_job(job.id)
            assert (await kinds(store, job.id))[-1] == kind
        waiting = await submit(store)
        await end(store, waiting, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW + 100)
        stopped = await store.request_cancel(waiting.id, reason="enough", kind="cancel", now=NOW)
        assert stopped.state is JobState.CANCELLED
        assert await store.promote_retries(now=NOW + 100, aging_s=AGING) == 0
        with pytest.raises(NotFound):
            await store.request_cancel("no-such-job", reason="x", kind="cancel", now=NOW)

    use_store(body)


def test_cancel_running_job_is_persisted_and_visible(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        c = await start(store, job)
        flagged = await store.request_cancel(job.id, reason="operator", kind="cancel", now=NOW + 1)
        assert flagged.state is JobState.RUNNING and flagged.cancel_requested == "operator"
        assert flagged == await store.get_job(job.id)
        [(live, attempt)] = await store.inflight()
        assert live.cancel_requested == "operator" and live.stop_kind == "cancel"
        assert attempt.id == c.attempt.id
        # a second request keeps the first; only one event
        again = await store.request_cancel(job.id, reason="again", kind="cancel", now=NOW + 2)
        assert again == await store.get_job(job.id)
        assert again.cancel_requested == "operator"
        assert (await kinds(store, job.id)).count("cancel_requested") == 1
        done = await end_attempt(
            store,
            c,
            JobState.CANCELLED,
            exit_code=None,
            outcome=Outcome.CANCELLED,
            error="operator",
        )
        assert done.state is JobState.CANCELLED
        assert (await store.attempts(job.id))[0].state is AttemptState.CANCELLED
        # a starting job can be flagged too
        starting = await submit(store)
        await start(store, starting, pid=None)
        killed = await store.request_cancel(starting.id, reason="kill switch", kind="kill", now=NOW)
        assert killed.state is JobState.STARTING and killed.stop_kind == "kill"
        assert "kill_requested" in await kinds(store, starting.id)

    use_store(body)


# ---- dead-letter queue ---------------------------------------------------------------------


def test_dead_letter_queue_requeue_and_purge(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        dead = await submit(store, limits=Limits(max_attempts=1))
        dead = await end(store, dead, JobState.DEAD_LETTERED, exit_code=1, error="exhausted")
        dlq = JobQuery(dead_lettered_unresolved=True)
        assert [j.id for j in await store.list_jobs(dlq)] == [dead.id]
        fresh = make_job(requeued_from=dead.id, command=dead.command)
        requeued = await store.dlq_requeue(dead.id, fresh, now=NOW + 10)
        assert requeued.id == fresh.id and requeued.state is JobState.QUEUED
        assert requeued.attempts == 0 and requeued.requeued_from == dead.id
        resolved = await store.get_job(dead.id)
        assert resolved.dlq_resolution == f"requeued:{fresh.id}"
        assert resolved.state is JobState.DEAD_LETTERED
        assert await store.list_jobs(dlq) == []
        assert (await kinds(store, dead.id))[-1] == "dlq_requeued"
        with pytest.raises(Conflict, match="already resolved"):
            await store.dlq_requeue(dead.id, make_job(), now=NOW)
        with pytest.raises(Conflict, match="not in the dead-letter queue"):
            await store.dlq_requeue(requeued.id, make_job(), now=NOW)
        with pytest.raises(NotFound):
            await store.dlq_requeue("no-such-job", make_job(), now=NOW)
        other = await end(store, await submit(store), JobState.DEAD_LETTERED, exit_code=1)
        purged = await store.dlq_purge(other.id, now=NOW)
        assert purged.dlq_resolution == "purged"
        assert (await store.get_job(other.id)).dlq_resolution == "purged"
        assert (await kinds(store, other.id))[-1] == "dlq_purged"
        with pytest.raises(Conflict):
            await store.dlq_purge(other.id, now=NOW)
        assert await store.list_jobs(dlq) == []
        assert await store.counts() == {"DEAD_LETTERED": 2, "QUEUED": 1}

    use_store(body)


def test_dlq_requeue_is_atomic(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        dead = await end(store, await submit(store), JobState.DEAD_LETTERED, exit_code=1)
        with pytest.raises(NotFound):
            await store.dlq_requeue(dead.id, make_job(after=("missing",)), now=NOW)
        assert (await store.get_job(dead.id)).dlq_resolution is None
        assert [j.id for j in await store.list_jobs(JobQuery(dead_lettered_unresolved=True))] == [
            dead.id
        ]
        holder = await submit(store, key="k")  # a live job now holds the dead job's key
        with pytest.raises(Conflict, match="held by job " + holder.id):
            await store.dlq_requeue(dead.id, make_job(key="k"), now=NOW)
        assert (await store.get_job(dead.id)).dlq_resolution is None

    use_store(body)


# ---- recovery views and events -------------------------------------------------------------


def test_inflight_pairs_jobs_with_their_current_attempt(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        running = await submit(store)
        retried = await submit(store)
        starting = await submit(store)
        queued = await submit(store)
        await start(store, running)
        await end(store, retried, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW)
        await store.promote_retries(now=NOW, aging_s=AGING)
        second = await start(store, retried)
        await start(store, starting, pid=None)
        pairs = await store.inflight()
        assert [j.id for j, _ in pairs] == [running.id, retried.id, starting.id]
        assert [j.state for j, _ in pairs] == [
            JobState.RUNNING,
            JobState.RUNNING,
            JobState.STARTING,
        ]
        for job, attempt in pairs:
            assert attempt.job_id == job.id and attempt.index == job.attempts
        assert pairs[1][1].id == second.attempt.id
        assert queued.id not in {j.id for j, _ in pairs}

    use_store(body)


def test_events_paginate_by_increasing_id(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        noise = await submit(store)
        await store.append_events(
            [
                JobEvent(job_id=job.id, at=NOW + i, kind=f"note{i}", data={"i": i, "xs": [i]})
                for i in range(5)
            ]
        )
        await store.append_events([JobEvent(job_id=noise.id, at=NOW, kind="other")])
        page = await store.events(job.id)
        ids = [i for i, _ in page]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 6
        assert [e.kind for _, e in page] == ["submitted", *(f"note{i}" for i in range(5))]
        rest = await store.events(job.id, after_id=ids[2])
        assert [i for i, _ in rest] == ids[3:]
        assert rest[0][1] == JobEvent(
            job_id=job.id, at=NOW + 2, kind="note2", data={"i": 2, "xs": [2]}
        )
        assert await store.events(job.id, after_id=ids[-1]) == []
        assert [e.kind for _, e in await store.events(noise.id)] == ["submitted", "other"]
        assert await store.events("no-such-job") == []

    use_store(body)


# ---- two engines on one PostgreSQL database ------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_two_engines_claim_each_job_exactly_once(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    total = 500

    async def engine(store: Store, name: str, finished: list[str]) -> None:
        tick = 0
        while True:
            tick += 1
            now = NOW + tick * 0.001
            jobs = await store.reserve(engine_id=name, now=now, limit=10, where=QueueFilter())
            if not jobs:
                return
            won = await store.start_attempts([claim(j, engine=name) for j in jobs], now=now)
            moved = await store.finish(
                [ending(c.attempt, JobState.SUCCEEDED) for c in won], now=now
            )
            finished.extend(j.id for j in moved)

    async def main() -> None:
        setup = new_store()
        await setup.open()
        jobs = [make_job() for _ in range(total)]
        for job in jobs:
            await setup.submit(job, now=NOW, aging_s=AGING)
        await setup.close()
        async with opened(new_store(), new_store(), new_store()) as (one, two, setup):
            got1: list[str] = []
            got2: list[str] = []
            await asyncio.gather(engine(one, "engine-1", got1), engine(two, "engine-2", got2))
            assert not set(got1) & set(got2)
            assert len(got1) + len(got2) == total
            assert set(got1) | set(got2) == {j.id for j in jobs}
            assert got1 and got2, "both engines should have taken work"
            assert await setup.counts() == {"SUCCEEDED": total}
            for job in jobs:
                [attempt] = await setup.attempts(job.id)
                assert attempt.state is AttemptState.SUCCEEDED
                assert (await kinds(setup, job.id)).count("ended") == 1

    asyncio.run(main())


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_two_engines_submitting_one_key_create_one_job(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        async with opened(new_store(), new_store()) as (one, two):
            results = await asyncio.gather(
                *(
                    store.submit(make_job(key="shared"), now=NOW, aging_s=AGING)
                    for _ in range(10)
                    for store in (one, two)
                )
            )
            assert sum(r.created for r in results) == 1
            assert len({r.job.id for r in results}) == 1
            assert await one.counts() == {"QUEUED": 1}

    asyncio.run(main())


def test_stale_engines_are_those_that_stopped_heart_beating(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.register_engine("e-old", pid=1, host="h", now=100.0)
        await store.register_engine("e-new", pid=2, host="h", now=100.0)
        await store.heartbeat_engine("e-new", now=200.0)
        assert await store.stale_engines(before=150.0, exclude="e-me") == ["e-old"]
        assert await store.stale_engines(before=150.0, exclude="e-old") == []

    use_store(body)


def test_a_takeover_fences_the_old_owner_out_of_the_attempt(use_store: UseStore) -> None:
    """A peer takes a dead engine's attempt over: the old engine's heart-beat is refused and
    its writes of the attempt's state change nothing; the new owner's apply."""

    async def body(store: Store) -> None:
        await store.register_engine("e-old", pid=1, host="h", now=NOW)
        await store.register_engine("e-new", pid=2, host="h", now=NOW)
        c = claim(await submit(store), engine="e-old")
        await store.start_attempts([c], now=NOW)
        assert await store.heartbeat_engine("e-old", now=NOW + 1)
        [(_, seen)] = await store.inflight()
        assert await store.take_over("e-new", [seen], fence=["e-old"], now=NOW + 20) == [
            c.attempt.id
        ]
        assert await store.take_over("e-other", [seen], fence=[], now=NOW + 20) == [], (
            "a second peer loses the compare-and-set"
        )
        assert not await store.heartbeat_engine("e-old", now=NOW + 21)
        assert await store.heartbeat_engine("e-new", now=NOW + 21)
        fenced = {e.id: e.fenced_at for e in await store.engines()}
        assert fenced == {"e-old": NOW + 20, "e-new": None}
        # The old owner wakes up: its writes are refused.
        assert await store.mark_running([(c.attempt, AttemptRef.local(111))], now=NOW + 22) == 0
        assert (
            await store.finish([ending(c.attempt, JobState.FAILED, exit_code=9)], now=NOW + 22)
            == []
        )
        [(job, attempt)] = await store.inflight()
        assert job.state is JobState.STARTING and attempt.engine_id == "e-new"
        assert attempt.state is AttemptState.STARTING and attempt.pid is None
        # The new owner's apply.
        mine = attempt
        assert await store.mark_running([(mine, AttemptRef.local(222))], now=NOW + 23) == 1
        [done] = await store.finish([ending(mine, JobState.SUCCEEDED)], now=NOW + 24)
        assert done.state is JobState.SUCCEEDED
        [final] = await store.attempts(job.id)
        assert final.pid == 222 and final.exit_code == 0 and final.engine_id == "e-new"

    use_store(body)


def test_a_final_refusal_denies_a_queued_job_and_the_lifecycle_is_enforced(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        queued = await submit(store, key="kd")
        denied = await store.request_cancel(
            queued.id, reason="FATAL_MODE: safe stop", kind="deny", now=NOW
        )
        assert denied.state is JobState.DENIED
        assert (await store.submit(make_job(key="kd"), now=NOW, aging_s=AGING)).created
        running = await submit(store)
        c = await start(store, running)
        backwards = Finish(
            attempt=c.attempt,
            result=AttemptResult(outcome=Outcome.EXITED, exit_code=1),
            job_state=JobState.QUEUED,
        )
        with pytest.raises(Conflict, match="cannot go from RUNNING to QUEUED"):
            await store.finish([backwards], now=NOW)
        assert (await store.get_job(running.id)).state is JobState.RUNNING

    use_store(body)


def test_core_events_are_appended_and_read_back_by_kind(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        opened = {
            "at": 10.0,
            "kind": "breaker",
            "scope": "worker",
            "name": "worker:codex",
            "state": "OPEN",
            "severity": "high",
            "reason": "failure_rate",
            "message": "5 of 8 failed",
            "data": {"calls": 8, "failures": 5},
        }
        stage = {
            **opened,
            "at": 11.0,
            "kind": "defense",
            "name": "watchdog",
            "state": "shed",
            "reason": "threshold_exceeded",
            "data": {},
        }
        await store.append_core_events([opened, stage])
        await store.append_core_events(
            [{**opened, "at": 12.0, "state": "HALF_OPEN", "reason": "open_elapsed", "data": {}}]
        )
        breakers = await store.core_events(kind="breaker")
        assert [(e["state"], e["reason"]) for e in breakers] == [
            ("OPEN", "failure_rate"),
            ("HALF_OPEN", "open_elapsed"),
        ]
        assert breakers[0]["data"] == {"calls": 8, "failures": 5}
        assert [e["kind"] for e in await store.core_events()] == ["breaker", "defense", "breaker"]
        assert [e["at"] for e in await store.core_events(limit=1)] == [12.0]

    use_store(body)


def test_runtime_budgets_round_trip_with_the_job(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        limits = Limits(max_tool_calls=7, token_budget_in=1234, token_budget_out=56)
        job = await submit(store, limits=limits)
        assert (await store.get_job(job.id)).limits == limits

    use_store(body)


def test_one_agent_event_per_attempt_is_kept_and_read_back(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        first = AgentEvent(
            event_id=new_id(),
            job_id=job.id,
            attempt=1,
            at=NOW,
            role="default",
            worker="claude-code",
            tenant="t1",
            session_id="s-1",
            tokens_in=10,
            tokens_out=2,
            cost_usd=0.5,
            limit_hit="max_tool_calls",
            checkpoint_count=3,
            tool_calls=(
                ToolCallTrace(tool="Bash", input={"command": "ls"}, output="a\n", duration_ms=4),
                ToolCallTrace(
                    tool="Bash", input={"command": "rm x"}, denied=True, reason="outside scope"
                ),
            ),
        )
        assert await store.record_agent_event(first)
        again = AgentEvent(
            event_id=new_id(),
            job_id=job.id,
            attempt=1,
            at=NOW + 1,
            role="default",
            worker="claude-code",
            tenant="t1",
        )
        assert not await store.record_agent_event(again)  # written once, never replaced
        second = AgentEvent(
            event_id=new_id(),
            job_id=job.id,
            attempt=2,
            at=NOW + 2,
            role="default",
            worker="claude-code",
            tenant="t1",
            retry_count=1,
        )
        assert await store.record_agent_event(second)
        assert await store.agent_events(job.id) == [first, second]
        assert await store.agent_events("nope") == []

    use_store(body)


def test_checkpoints_and_policy_evaluations_are_appended_in_order(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await submit(store)
        for n in (1, 2):
            await store.append_checkpoint(
                Checkpoint(
                    job_id=job.id,
                    attempt=1,
                    at=NOW + n,
                    worker="codex",
                    session_id="th-1",
                    tool_call_count=n,
                    last_tool="Bash",
                    last_output_digest=f"d{n}",
                )
            )
        cps = await store.checkpoints(job.id)
        assert [c.tool_call_count for c in cps] == [1, 2]
        assert cps[-1].session_id == "th-1" and cps[-1].last_output_digest == "d2"
        evs = [
            PolicyEvaluation(
                at=NOW + n,
                job_id=job.id,
                attempt=a,
                stage="tool_call",
                subject="Bash",
                verdict=v,
                reason=r,
                message=m,
                inputs={"calls": n},
            )
            for n, (a, v, r, m) in enumerate(
                [
                    (1, "allow", "allowed", ""),
                    (1, "deny", "max_tool_calls", "limit"),
                    (2, "allow", "allowed", ""),
                ]
            )
        ]
        await store.append_policy_evaluations(evs)
        got = await store.policy_evaluations(job.id)
        assert [(e.attempt, e.verdict, e.reason, e.inputs["calls"]) for e in got] == [
            (1, "allow", "allowed", 0),
            (1, "deny", "max_tool_calls", 1),
            (2, "allow", "allowed", 2),
        ]
        assert all(e.id is not None for e in got)
        assert [e.reason for e in await store.policy_evaluations(job.id, attempt=1)] == [
            "allowed",
            "max_tool_calls",
        ]
        assert len(await store.policy_evaluations(job.id, limit=1)) == 1

    use_store(body)


def _allow(job: Job) -> PolicyEvaluation:
    """The pre-run policy's allow of the job's first attempt."""
    return PolicyEvaluation(
        at=NOW, job_id=job.id, attempt=1, stage="pre_run", subject="run",
        verdict="allow", reason="allowed", message="", inputs={"step": "run"},
    )  # fmt: skip


def test_the_allows_commit_with_the_attempts_they_let_in(use_store: UseStore) -> None:
    """`start_attempts` appends the pre-run evaluations handed to it in its transaction,
    whichever claims win (a claim that lost was still allowed)."""

    async def body(store: Store) -> None:
        job = await submit(store)
        allow = _allow(job)
        won = await store.start_attempts([claim(job)], now=NOW, evaluations=[allow])
        assert len(won) == 1
        assert [(e.stage, e.verdict) for e in await store.policy_evaluations(job.id)] == [
            ("pre_run", "allow")
        ]
        again = await store.start_attempts([claim(job)], now=NOW, evaluations=[allow])
        assert again == []  # already started: the claim loses, the allow is written
        assert len(await store.policy_evaluations(job.id)) == 2

    use_store(body)


def test_a_submissions_evaluation_commits_with_its_job_or_not_at_all(use_store: UseStore) -> None:
    """The pre-run evaluation handed to `submit` is written in the job's transaction: with a
    created job; not for a submission coalesced into another (same key) nor for one a queue
    bound refused, whose job does not exist either."""

    async def body(store: Store) -> None:
        first = make_job(key="k1")
        made = await store.submit(first, now=NOW, aging_s=AGING, evaluations=[_allow(first)])
        assert made.created
        assert [e.reason for e in await store.policy_evaluations(first.id)] == ["allowed"]
        again = make_job(key="k1")
        twin = await store.submit(again, now=NOW, aging_s=AGING, evaluations=[_allow(again)])
        assert not twin.created and twin.job.id == first.id
        assert await store.policy_evaluations(again.id) == []
        refused = make_job()
        with pytest.raises(Backpressure):
            await store.submit(
                refused,
                now=NOW,
                aging_s=AGING,
                admission=Admission(max_queued=1),
                evaluations=[_allow(refused)],
            )
        assert await store.policy_evaluations(refused.id) == []
        assert [e.job_id for e in await store.recent_policy_evaluations()] == [first.id]

    use_store(body)


def test_active_runs_are_a_tenants_jobs_with_a_live_attempt(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        running = await submit(store, tenant="acme")
        await start(store, running)
        await submit(store, tenant="acme")  # queued: not active
        other = await submit(store, tenant="globex")
        await start(store, other)
        assert await store.active_runs("acme") == [running.id]
        assert await store.active_runs("nobody") == []

    use_store(body)


def test_a_queued_jobs_place_counts_the_runnable_jobs_before_it(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = await submit(store)
        urgent = await submit(store, priority=0)  # later, but ahead of a priority-2 job
        blocked = await submit(store, after=(first.id,))  # not runnable: not counted
        mine = await submit(store)
        assert await store.queued_ahead(mine) == 2
        assert await store.queued_ahead(urgent) == 0
        assert await store.queued_ahead(first) == 1
        await start(store, first)
        assert await store.queued_ahead(mine) == 1
        assert await store.queued_ahead(blocked) == 1

    use_store(body)


def test_live_engines_and_the_active_configuration(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.register_engine("e1", pid=1, host="h", now=NOW)
        await store.register_engine("e2", pid=2, host="h", now=NOW)
        await store.heartbeat_engine("e2", now=NOW + 30)
        assert await store.live_engines(since=NOW + 15) == ["e2"]
        assert await store.live_engines(since=NOW) == ["e1", "e2"]
        assert await store.active_config() is None
        old = EngineConfig(engine_id="e1", at=NOW, hash="a" * 64, source=None, text="")
        new = EngineConfig(
            engine_id="e2",
            at=NOW + 1,
            hash="b" * 64,
            source="/etc/c.yaml",
            text="roles: {notebook: {}}\n",
        )
        await store.publish_config(new)
        await store.publish_config(old)  # an engine that started earlier, written later
        assert await store.active_config() == new

    use_store(body)


def test_run_records_read_a_batch_as_the_per_job_reads_do(use_store: UseStore) -> None:
    """The reporter's one read per batch gives each job what its five reads of one job give."""

    async def body(store: Store) -> None:
        retried = await submit(store)

        def ended(attempt: int, cost: float) -> tuple[JobEvent, ...]:
            data = {"cost_usd": cost}
            at = NOW + 2
            return (
                JobEvent(
                    job_id=retried.id, at=at, kind="attempt_ended", attempt=attempt, data=data
                ),
            )

        first = await start(store, retried)
        await end_attempt(
            store, first, JobState.RETRY_WAIT, exit_code=1, retry_at=NOW, events=ended(1, 0.5)
        )
        assert await store.promote_retries(now=NOW + 10, aging_s=AGING) == 1
        done = await end(store, retried, JobState.SUCCEEDED, events=ended(2, 0.25))
        await store.record_agent_event(
            AgentEvent(
                event_id=new_id(),
                job_id=done.id,
                attempt=2,
                at=NOW + 4,
                role="default",
                worker="codex",
                tenant="t1",
                cost_usd=0.25,
            )
        )
        await store.append_policy_evaluations([_allow(done), _allow(done)])
        bare = await submit(store)
        asked = [bare.id, "no-such-job", done.id, bare.id]

        records = await store.run_records(asked)

        assert [r.job.id for r in records] == [bare.id, done.id]  # as asked, once, known only
        for r in records:
            job_id = r.job.id
            assert r.job == await store.get_job(job_id)
            assert r.attempts == await store.attempts(job_id)
            assert r.agent_events == await store.agent_events(job_id)
            assert r.evaluations == await store.policy_evaluations(job_id, limit=1 << 31)
            assert r.attempt_ends == [
                e for _, e in await store.events(job_id) if e.kind == "attempt_ended"
            ]
        assert [a.index for a in records[1].attempts] == [1, 2]
        assert [e.data["cost_usd"] for e in records[1].attempt_ends] == [0.5, 0.25]
        assert len(records[1].evaluations) == 2
        assert records[0].attempts == [] and records[0].attempt_ends == []
        assert await store.run_records([]) == []

    use_store(body)
