"""Retention in the store (`RetentionStore`): the same choices from the memory, SQLite and
PostgreSQL stores. Which terminal jobs are past retention (never one that has not ended), which
of them can go now (a chain is cut only before the first record of a job that stays, and never
past what an event sink has published), what goes with them, and that what stays is untouched,
still verifies from the archived head, and the metrics' counters keep what was removed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from corral.core.ports import ARCHIVED_CHAINS, ChainHead, Store, Tally
from corral.domain.agents import AgentEvent, PolicyEvaluation
from corral.domain.errors import Conflict, NotFound
from corral.domain.models import Job
from corral.domain.settings import KeepSpec, RetentionSpec
from corral.domain.states import JobState
from corral.store.chain import verify_rows
from corral.store.sql import SqlStore
from tests.contract.test_governance_contract import incident, report_for
from tests.contract.test_store_contract import (
    NOW,
    UseStore,
    end,
    ending,
    opened,
    start,
    submit,
)

DAY = 86400.0
LATER = NOW + 31 * DAY  # every job ended at NOW + 3 is past a 30-day retention then
BOUNDS = (0.5, 1.0, 5.0, 3600.0)
SPEC = RetentionSpec(default=KeepSpec(keep_days=30, keep_jobs=1000))


async def done(store: Store, state: JobState = JobState.SUCCEEDED, **kw: Any) -> Job:
    """A job that ran one attempt, ended in `state` and has its run report."""
    job = await end(store, await submit(store, **kw), state, exit_code=0)
    await store.record_report(report_for(job))
    return job


def _by(tallies: tuple[Tally, ...]) -> dict[tuple[str, ...], float]:
    return {t.labels: t.value for t in tallies}


def _finished(f: Any) -> dict[tuple[str, str], float]:
    """What corral_jobs_finished counts: terminal jobs in the store plus those removed."""
    out: dict[tuple[str, str], float] = {}
    for (role, _env, _prio, state), n in (*f.jobs, *f.removed):
        if JobState(state).terminal:
            out[(role, state)] = out.get((role, state), 0.0) + n
    return out


def test_candidates_are_terminal_jobs_past_age_or_count_never_live_ones(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        old = [await done(store, role="build") for _ in range(3)]
        other = await done(store, role="docs")
        queued = await submit(store, role="build")
        running = await submit(store, role="build")
        await start(store, running)
        waiting = await end(
            store, await submit(store, role="build"), JobState.RETRY_WAIT, retry_at=LATER * 2
        )
        unreported = await end(store, await submit(store, role="build"), JobState.FAILED)
        open_dlq = await end(store, await submit(store, role="build"), JobState.DEAD_LETTERED)
        await store.record_report(report_for(open_dlq))
        live = {queued.id, running.id, waiting.id, unreported.id, open_dlq.id}

        assert await store.gc_candidates(SPEC, now=NOW + DAY, limit=100) == []
        aged = await store.gc_candidates(SPEC, now=LATER, limit=100)
        assert set(aged) == {j.id for j in (*old, other)}
        assert not live & set(aged)
        assert len(await store.gc_candidates(SPEC, now=LATER, limit=2)) == 2
        # by count: each role keeps its newest `keep_jobs` terminal jobs, whatever their age
        by_count = RetentionSpec(
            default=KeepSpec(keep_days=1000, keep_jobs=5),
            roles={"build": KeepSpec(keep_days=1000, keep_jobs=4)},
        )
        # build's terminal jobs, newest first: open_dlq, unreported, old[2], old[1], old[0]
        assert await store.gc_candidates(by_count, now=LATER, limit=100) == [old[0].id]

    use_store(body)


def test_a_batch_goes_whole_and_what_stays_is_untouched(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = await done(store, role="build", tenant="acme", worker="claude")
        await store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=NOW,
                    job_id=first.id,
                    attempt=1,
                    stage="tool_call",
                    subject="Bash",
                    verdict="deny",
                    reason="out_of_scope",
                )
            ]
        )
        assert await store.record_agent_event(
            AgentEvent(
                event_id="e1",
                job_id=first.id,
                attempt=1,
                at=NOW,
                role="build",
                worker="claude",
                tenant="acme",
                tokens_in=120,
                tokens_out=30,
                cost_usd=0.25,
            )
        )
        [trouble] = await store.append_incidents([incident(first)])
        running = await submit(store, role="build")  # its records come between the two
        await start(store, running)
        second = await done(store, role="build")
        kept_before = (
            await store.get_job(running.id),
            await store.attempts(running.id),
            await store.events(running.id),
        )
        figures_before = await store.fleet_figures(BOUNDS)

        batch = await store.gc_collect([first.id, second.id], sinks=())
        assert batch.jobs == (first.id,) and batch.held == 1  # second's records follow running's
        assert {r["id"] for r in batch.rows["jobs"]} == {first.id}
        assert len(batch.rows["attempts"]) == 1 and len(batch.rows["agent_events"]) == 1
        timeline = batch.rows["job_events"]
        assert {r["job_id"] for r in timeline} == {first.id}
        assert len(timeline) == len(await store.events(first.id))
        start_at, end_at = batch.segments["job_events"]
        assert start_at == ChainHead(0, "") and end_at.seq == timeline[-1]["seq"]
        assert [r["job_id"] for r in batch.rows["policy_evaluations"]] == [first.id]
        # every chain of a job's records goes with it: its report and its incident too
        assert [r["job_id"] for r in batch.rows["run_reports"]] == [first.id]
        assert [r["id"] for r in batch.rows["incidents"]] == [trouble.id]
        assert batch.rows["approval_events"] == ()
        assert batch.dirs == (batch.rows["attempts"][0]["dir"],)
        # the archived segment verifies on its own, from the start to its head
        key = store.audit_key.get(create=False) if store.audit_key else None  # type: ignore[attr-defined]
        check = verify_rows("job_events", timeline, end_at, key)
        assert check.problems == [] and check.checked == len(timeline)

        assert await store.gc_remove(batch, archive="a1.jsonl", now=LATER, bounds=BOUNDS) == 1
        with pytest.raises(NotFound):
            await store.get_job(first.id)
        assert await store.attempts(first.id) == []
        assert await store.get_job(second.id)
        after = (
            await store.get_job(running.id),
            await store.attempts(running.id),
            await store.events(running.id),
        )
        assert after == kept_before
        assert batch.segments["job_events"][1] == end_at
        assert await store.archived_heads() == {t: batch.segments[t][1] for t in ARCHIVED_CHAINS}
        assert await store.incidents(first.id) == [] and await store.report(first.id) is None
        [record] = await store.archives()
        assert record.file == "a1.jsonl" and record.jobs == 1
        assert record.segments == batch.segments
        audit = await store.verify_audit()
        assert audit.ok, audit.problems
        with pytest.raises(Conflict):  # the archived heads moved: the same batch cannot go twice
            await store.gc_remove(batch, archive="a2.jsonl", now=LATER, bounds=BOUNDS)

        figures = await store.fleet_figures(BOUNDS)
        assert _finished(figures) == _finished(figures_before)
        assert figures.usage == figures_before.usage
        assert _by(figures.tool_calls) == _by(figures_before.tool_calls)
        assert _by(figures.attempts) == _by(figures_before.attempts)
        runs = {d.labels: d.observed for d in figures.attempt_seconds}
        assert runs == {d.labels: d.observed for d in figures_before.attempt_seconds}

        # running ends: now second can go too, after it
        await store.finish(
            [ending((await store.attempts(running.id))[-1], JobState.SUCCEEDED)],
            now=NOW + 3,
        )
        await store.record_report(report_for(await store.get_job(running.id)))
        ids = await store.gc_candidates(SPEC, now=LATER, limit=100)
        assert set(ids) == {second.id, running.id}
        batch = await store.gc_collect(ids, sinks=())
        assert set(batch.jobs) == set(ids) and batch.held == 0
        assert batch.segments["job_events"][0] == end_at
        assert await store.gc_remove(batch, archive="a2.jsonl", now=LATER, bounds=BOUNDS) == 2
        audit = await store.verify_audit()
        assert audit.ok, audit.problems
        assert _finished(await store.fleet_figures(BOUNDS)) == {("build", "SUCCEEDED"): 3}

    use_store(body)


def test_what_a_sink_has_not_published_stays(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        first = await done(store)
        second = await done(store)
        mine = len(await store.events(first.id))
        cursors = await store.claim_cursors(
            "bus",
            ["job_events", "policy_evaluations", "run_reports"],
            holder="e1",
            now=NOW,
            lease_s=60,
        )
        assert cursors is not None
        batch = await store.gc_collect([first.id, second.id], sinks=["bus"])
        assert batch.jobs == () and batch.held == 2  # nothing published yet
        await store.advance_cursor("bus", "job_events", holder="e1", last_id=mine, now=NOW)
        batch = await store.gc_collect([first.id, second.id], sinks=["bus"])
        assert batch.jobs == () and batch.held == 2  # its run report is not published yet
        await store.advance_cursor("bus", "run_reports", holder="e1", last_id=1, now=NOW)
        batch = await store.gc_collect([first.id, second.id], sinks=["bus"])
        assert batch.jobs == (first.id,) and batch.held == 1
        assert batch.segments["job_events"][1].seq == mine
        # a sink that is not configured any more does not hold anything back
        batch = await store.gc_collect([first.id, second.id], sinks=[])
        assert set(batch.jobs) == {first.id, second.id}

    use_store(body)


def test_the_chains_refuse_a_delete_above_the_archived_head(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        job = await done(store)
        if not isinstance(store, SqlStore):
            return  # the memory store has no triggers: only its own code changes its rows
        for table in ("job_events", "run_reports"):
            with pytest.raises(Exception, match="append-only"):
                async with store.driver.write() as tx:
                    await tx.execute(f"DELETE FROM {table} WHERE job_id = ?", (job.id,))
        batch = await store.gc_collect([job.id], sinks=())
        assert await store.gc_remove(batch, archive="a.jsonl", now=LATER, bounds=BOUNDS) == 1
        later = await done(store)
        for table in ("job_events", "run_reports"):
            with pytest.raises(Exception, match="append-only"):
                async with store.driver.write() as tx:
                    await tx.execute(f"DELETE FROM {table} WHERE job_id = ?", (later.id,))

    use_store(body)


def test_one_collector_at_a_time(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.claim_gc("a", now=NOW, lease_s=60)
        assert await store.claim_gc("a", now=NOW + 1, lease_s=60)  # renewed
        assert not await store.claim_gc("b", now=NOW + 2, lease_s=60)
        assert await store.claim_gc("b", now=NOW + 62, lease_s=60)  # a's lease ran out
        await store.release_gc("a")  # not a's any more: nothing happens
        assert not await store.claim_gc("a", now=NOW + 63, lease_s=60)
        await store.release_gc("b")
        assert await store.claim_gc("a", now=NOW + 64, lease_s=60)

    use_store(body)


def test_a_record_of_a_job_already_gone_holds_nothing_back(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        gone = await done(store)
        batch = await store.gc_collect([gone.id], sinks=())
        assert await store.gc_remove(batch, archive="a1", now=LATER, bounds=BOUNDS) == 1
        late = PolicyEvaluation(
            at=NOW,
            job_id=gone.id,
            attempt=1,
            stage="tool_call",
            subject="Bash",
            verdict="allow",
            reason="allowed",
        )
        await store.append_policy_evaluations([late])  # written after its job was collected
        after = await done(store)
        batch = await store.gc_collect([after.id], sinks=())
        assert batch.jobs == (after.id,)
        assert gone.id in {r["job_id"] for r in batch.rows["policy_evaluations"]}
        assert await store.gc_remove(batch, archive="a2", now=LATER, bounds=BOUNDS) == 1
        assert (await store.verify_audit()).ok

    use_store(body)


@pytest.mark.postgres
@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_two_engines_collecting_at_once_remove_each_job_once(
    store_kind: str, new_store: Callable[[], Store]
) -> None:
    async def main() -> None:
        async with opened(new_store(), new_store()) as (one, two):
            jobs = [await done(one) for _ in range(6)]
            # the lease: of two engines claiming at once, one holds it
            won = await asyncio.gather(
                one.claim_gc("one", now=NOW, lease_s=60), two.claim_gc("two", now=NOW, lease_s=60)
            )
            assert sorted(won) == [False, True]
            # past the lease, the archived head is a compare-and-set: one batch wins
            ids = [j.id for j in jobs]
            first, second = await asyncio.gather(
                one.gc_collect(ids, sinks=()), two.gc_collect(ids, sinks=())
            )
            results = await asyncio.gather(
                one.gc_remove(first, archive="a", now=LATER, bounds=BOUNDS),
                two.gc_remove(second, archive="b", now=LATER, bounds=BOUNDS),
                return_exceptions=True,
            )
            assert sum(1 for r in results if isinstance(r, Conflict)) == 1
            assert [r for r in results if isinstance(r, int)] == [6]
            assert len(await two.archives()) == 1
            assert (await one.verify_audit()).ok
            assert _finished(await two.fleet_figures(BOUNDS)) == {("default", "SUCCEEDED"): 6}

    asyncio.run(main())


def test_a_sink_added_after_retention_starts_after_the_archived_records(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        job = await done(store)
        batch = await store.gc_collect([job.id], sinks=())
        assert await store.gc_remove(batch, archive="a", now=LATER, bounds=BOUNDS) == 1
        cursors = await store.claim_cursors("new", ["job_events"], holder="e1", now=NOW, lease_s=60)
        assert cursors is not None
        assert [c.last_id for c in cursors] == [batch.segments["job_events"][1].seq]

    use_store(body)
