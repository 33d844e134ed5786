"""The world model's store contract (the WorldReads and BaselineStore ports, core/ports.py), on
the memory, SQLite and PostgreSQL stores: the live jobs and the latest ended ones as narrow
rows, the latest checkpoint and the wait events of given jobs; baseline samples kept per (role,
kind, metric), oldest first, the latest `window` of them."""

from __future__ import annotations

from typing import Any

from corral.core.ports import JobQuery, Store
from corral.domain.agents import Checkpoint
from corral.domain.models import Job, JobEvent
from corral.domain.states import JobState
from tests.contract.test_store_contract import AGING, NOW, UseStore, claim, ending, make_job


async def submitted(store: Store, **kw: Any) -> Job:
    return (await store.submit(make_job(**kw), now=NOW, aging_s=AGING)).job


def test_baselines_keep_the_latest_samples_per_role_kind_and_metric(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.baselines() == []
        await store.add_baseline_samples(
            [("coder", "claude", "tool_calls", 3.0), ("coder", "claude", "tokens", 900.0)],
            now=NOW,
            window=3,
        )
        await store.add_baseline_samples(
            [("coder", "claude", "tool_calls", v) for v in (4.0, 5.0, 6.0)], now=NOW + 1, window=3
        )
        await store.add_baseline_samples([("aaa", "x", "tool_calls", 1)], now=NOW + 2, window=3)
        found = {(b.role, b.kind, b.metric): b for b in await store.baselines()}
        assert [(b.role, b.metric) for b in await store.baselines()] == [
            ("aaa", "tool_calls"),
            ("coder", "tokens"),
            ("coder", "tool_calls"),
        ]
        calls = found[("coder", "claude", "tool_calls")]
        assert calls.samples == (4.0, 5.0, 6.0) and calls.updated_at == NOW + 1
        assert found[("coder", "claude", "tokens")].samples == (900.0,)
        assert calls.median == 5.0 and not calls.ready  # fewer than five

    use_store(body)


def test_world_reads_the_live_jobs_and_the_latest_ended_ones(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        ended = []
        for _ in range(3):
            job = await submitted(store)
            [won] = await store.start_attempts([claim(job)], now=NOW)
            await store.finish([ending(won.attempt, JobState.SUCCEEDED)], now=NOW + 1)
            ended.append(job.id)
        running = await submitted(store)
        [won] = await store.start_attempts([claim(running)], now=NOW)
        queued = await submitted(store, parent_id=running.id, depth=1)
        sketches = {s.id: s for s in await store.world_jobs(finished=2)}
        assert set(sketches) == {running.id, queued.id, *ended[-2:]}  # the newest two ended
        child = sketches[queued.id]
        assert (child.state, child.parent_id, child.role, child.env_name) == (
            JobState.QUEUED,
            running.id,
            "default",
            "local",
        )
        assert sketches[ended[-1]].exit_code == 0
        children = await store.list_jobs(JobQuery(parent_id=running.id))
        assert [j.id for j in children] == [queued.id]
        assert await store.list_jobs(JobQuery(parent_id=queued.id)) == []

        for n in (1, 2):
            await store.append_checkpoint(
                Checkpoint(
                    job_id=running.id,
                    attempt=1,
                    at=NOW + n,
                    worker="claude",
                    session_id="s",
                    tool_call_count=n,
                    last_tool=f"T{n}",
                    last_output_digest=None,
                )
            )
        await store.append_events(
            [
                JobEvent(
                    job_id=running.id, at=NOW + 3, kind="wait_started", data={"on": queued.id}
                ),
                JobEvent(job_id=running.id, at=NOW + 4, kind="note", data={"on": "x"}),
                JobEvent(job_id=running.id, at=NOW + 5, kind="wait_ended", data={"on": queued.id}),
            ]
        )
        latest, waits = await store.world_records([running.id, queued.id])
        assert set(latest) == {running.id}
        assert (latest[running.id].tool_call_count, latest[running.id].last_tool) == (2, "T2")
        assert [(e.kind, e.data["on"]) for e in waits] == [
            ("wait_started", queued.id),
            ("wait_ended", queued.id),
        ]
        assert await store.world_records([]) == ({}, [])

    use_store(body)
