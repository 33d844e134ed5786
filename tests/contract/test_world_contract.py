"""The world model's store contract (the WorldReads and BaselineStore ports, core/ports.py), on
the memory, SQLite and PostgreSQL stores: the live jobs and the latest ended ones as narrow
rows, the latest checkpoint and the wait events of given jobs; baseline samples kept per (role,
kind, metric), oldest first, the latest `window` of them."""

from __future__ import annotations

from typing import Any

from corral.core.ports import JobQuery, Store
from corral.domain.agents import Checkpoint
from corral.domain.models import Job, JobEvent, JobOptions
from corral.domain.settings import EnvSpec, RoleSpec, Settings
from corral.domain.states import JobState
from corral.runtime.worldwatch import Scope, caps_of, open_waits, snapshot
from corral.services.world import world_view
from corral.world.model import build
from tests.contract.test_store_contract import (
    AGING,
    NOW,
    UseStore,
    claim,
    ending,
    make_job,
    start,
    submit,
)


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
        running = await submitted(store, options=JobOptions(workflow="wf"))
        [won] = await store.start_attempts([claim(running)], now=NOW)
        queued = await submitted(store, parent_id=running.id, depth=1)
        alone = await submitted(store)  # waits in the queue on its own: counted, not read
        behind = await submitted(store, after=(alone.id,))
        other = await submitted(store, tenant="t2", env_name="gpu")
        sketches = {s.id: s for s in await store.world_jobs(finished=2)}
        # the newest two ended; the job in flight is world_inflight's
        assert set(sketches) == {queued.id, behind.id, *ended[-2:]}
        assert sketches[behind.id].after == (alone.id,) and sketches[behind.id].deps_pending == 1
        [(flying, attempt)] = await store.world_inflight()
        assert (flying.id, flying.state, flying.workflow) == (running.id, JobState.STARTING, "wf")
        assert (attempt.index, attempt.started_at) == (1, won.attempt.started_at)
        assert await store.world_queues() == {"local": 3, "gpu": 1}
        assert await store.world_queues(tenant="t2") == {"gpu": 1}
        assert await store.world_queues(tenant="nobody") == {}
        found = await store.world_sketches([alone.id, ended[0], "nope", other.id])
        assert sorted(s.id for s in found) == sorted([alone.id, other.id])  # live ones only
        assert await store.world_sketches([]) == []
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


def test_the_snapshot_from_narrow_reads_is_the_one_built_over_every_live_job(
    use_store: UseStore,
) -> None:
    """The snapshot reads only the live jobs that can take part in an edge or a link, counts
    the rest in the store and reads the few targets it lacks: what it shows is exactly what
    building over every live job shows (the jobs waiting on their own included)."""
    settings = Settings(
        roles={"default": RoleSpec(name="default", concurrency=2)},
        environments={"local": EnvSpec(name="local", max_inflight=8)},
    )

    async def body(store: Store) -> None:
        r1 = await start(store, await submit(store))
        r2 = await start(store, await submit(store, parent_id=r1.job.id, depth=1))
        alone = await submitted(store)  # r1 follows it to its end: a target not read at first
        await submitted(store)  # waits on its own: counted only
        await submitted(store, parent_id=r2.job.id, depth=2)  # full role held by its ancestors
        await submitted(store, after=(r1.job.id,))
        await submitted(store, after=(alone.id,))
        await submitted(store, tenant="t2", env_name="gpu")
        await store.append_events(
            [JobEvent(job_id=r1.job.id, at=NOW, kind="wait_started", data={"on": alone.id})]
        )
        for scope in (Scope(finished=0), Scope(finished=0, tenant="t2")):
            snap = await snapshot(store, settings, scope, clock=lambda: NOW)
            every = [
                j
                for j in await store.list_jobs(JobQuery(limit=1000))
                if not j.state.terminal and scope.tenant in (None, j.tenant)
            ]
            ids = {j.id for j in every}
            inflight = [(j, a) for j, a in await store.inflight() if j.id in ids]
            checkpoints, timeline = await store.world_records([j.id for j, _ in inflight])
            waits = {
                j.id: open_waits([e for e in timeline if e.job_id == j.id]) for j, _ in inflight
            }
            full = build(every, inflight, checkpoints, waits, caps_of(settings), now=NOW)
            assert world_view(snap).dump() == world_view(full).dump()
        shown = world_view(await snapshot(store, settings, clock=lambda: NOW))
        assert {e.relationship for e in shown.execution_topology} == {
            "spawned_by",
            "blocked_by",
            "waits_for",
            "waits_for_slot",
        }
        assert shown.user_plane["local"].queue_depth == 5

    use_store(body)
