"""The world model through the store and the HTTP API: a parent running in its role's only slot
that follows its queued child (a recorded wait) shows as a deadlock with the cycle; the
snapshot holds the token's tenant's jobs only; `corral wait` from inside a job records the
wait on the waiting job's timeline and closes it after."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio

from corral.core.ports import AttemptRef
from corral.domain.agents import Checkpoint
from corral.domain.errors import StoreError
from corral.domain.models import JobEvent
from corral.services import world
from corral.store.memory import MemoryStore
from tests.contract.test_store_contract import AGING, NOW, claim, make_job
from tests.unit.test_api_jobs import Api, assert_problem, config, with_api

WORLD = """\
default_role: planner
roles:
  planner: {concurrency: 1}
api: {rate_limit: {per_s: 1000, burst: 1000}}
"""


async def parent_and_child(store: MemoryStore, tenant: str = "acme") -> tuple[str, str]:
    """A running planner job and its queued planner child, the parent following the child."""
    parent = (
        await store.submit(make_job(role="planner", tenant=tenant), now=NOW, aging_s=AGING)
    ).job
    [won] = await store.start_attempts([claim(parent)], now=NOW)
    await store.mark_running([(won.attempt, AttemptRef.local(4242))], now=NOW)
    await store.append_checkpoint(
        Checkpoint(
            job_id=parent.id,
            attempt=1,
            at=NOW + 1,
            worker="claude",
            session_id="s-1",
            tool_call_count=3,
            last_tool="Bash",
            last_output_digest=None,
        )
    )
    child = make_job(role="planner", tenant=tenant, parent_id=parent.id, depth=1)
    child = (await store.submit(child, now=NOW, aging_s=AGING)).job
    assert await world.record_wait(store, parent.id, child.id, started=True, clock=lambda: NOW)
    return parent.id, child.id


def test_the_world_model_shows_a_deadlock_to_its_tenant_only(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        parent, child = await parent_and_child(api.store)
        r = await api.client.get("/agentops/world-model", headers=api.auth("reader"))
        assert r.status_code == 200, r.text
        w = r.json()
        agent = w["agents"][parent]
        assert (agent["role"], agent["status"], agent["tool_call_count"]) == (
            "planner",
            "RUNNING",
            3,
        )
        assert (agent["current_tool"], agent["session_id"]) == ("Bash", "s-1")
        assert w["user_plane"]["local"]["jobs_in_flight"] == 1
        assert w["user_plane"]["local"]["queue_depth"] == 1
        edges = {
            (e["job_id"], e["relationship"], e["related_job_id"]) for e in w["execution_topology"]
        }
        assert edges == {
            (child, "spawned_by", parent),
            (parent, "waits_for", child),
            (child, "waits_for_slot", parent),
        }
        (dead,) = w["deadlocks"]
        assert sorted(dead["jobs"]) == sorted([parent, child])
        assert {(e["relationship"]) for e in dead["cycle"]} == {"waits_for", "waits_for_slot"}
        causes = {c["control_plane_intent_id"]: c for c in w["causal_graph"]}
        assert causes[child]["root_intent_id"] == parent
        assert causes[child]["user_plane_job"] == {
            "ray_submission_id": None,
            "notebook": None,
            "wandb_run": None,
        }
        other = (await api.client.get("/agentops/world-model", headers=api.auth("other"))).json()
        assert other["agents"] == {} and other["deadlocks"] == [] and other["causal_graph"] == []
        assert_problem(await api.client.get("/agentops/world-model"), 401, "unauthenticated")
        no_scope = await api.client.get("/agentops/world-model", headers=api.auth("approver"))
        assert_problem(no_scope, 403, "not_permitted")

    with_api(config(tmp_path, WORLD), body)


def test_a_wait_that_ended_is_no_edge(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        parent, child = await parent_and_child(api.store)
        await world.record_wait(api.store, parent, child, started=False, clock=lambda: NOW + 2)
        snap = await world.snapshot(api.store, config(tmp_path, WORLD).settings)
        assert snap.deadlocks == ()
        assert not [e for e in snap.edges if e.kind == "waits_for"]
        kinds = [e.kind for _, e in await api.store.events(parent)]
        assert kinds[-2:] == [world.WAIT_STARTED, world.WAIT_ENDED]

    with_api(config(tmp_path, WORLD), body)


def test_a_wait_is_recorded_only_for_a_job_that_exists() -> None:
    async def main() -> None:
        store = MemoryStore()
        assert not await world.record_wait(store, "0" * 26, "x", started=True)

    anyio.run(main)


def test_a_wait_goes_on_unrecorded_when_the_store_cannot_take_the_write() -> None:
    class Busy(MemoryStore):
        async def append_events(self, events: Sequence[JobEvent]) -> None:
            raise StoreError("database is locked")

    async def main() -> None:
        store = Busy()
        parent = (await store.submit(make_job(), now=NOW, aging_s=AGING)).job
        assert not await world.record_wait(store, parent.id, "x", started=True)

    anyio.run(main)
