"""The engine's world watch: a deadlock among live jobs is raised once — one critical incident
`deadlock` carrying the cycle, one core event — and not again on the next look, nor by a
restarted engine's watch over the same store; nothing in the cycle is stopped."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from corral.domain.errors import CorralError
from corral.domain.governance import IncidentType, Severity
from corral.domain.states import JobState
from corral.runtime.worldwatch import WorldWatch
from corral.store.memory import MemoryStore
from tests.contract.test_store_contract import NOW
from tests.unit.test_api_jobs import config
from tests.unit.test_api_world import WORLD, parent_and_child


def test_a_deadlock_is_raised_once_with_its_cycle(tmp_path: Path) -> None:
    settings = config(tmp_path, WORLD).settings

    async def main() -> None:
        store = MemoryStore()
        parent, child = await parent_and_child(store)
        watch = WorldWatch(store, settings, clock=lambda: NOW + 5)
        (incident,) = await watch.look()
        assert incident.type is IncidentType.DEADLOCK and incident.severity is Severity.CRITICAL
        assert sorted(incident.context["cycle"]) == sorted([parent, child])
        assert {e["relationship"] for e in incident.context["edges"]} == {
            "waits_for",
            "waits_for_slot",
        }
        assert parent in incident.message and child in incident.message
        assert await watch.look() == []  # once
        assert await WorldWatch(store, settings).look() == []  # a restarted engine: still once
        assert [i.id for i in await store.incidents(None, open_only=True, limit=10)] == [
            incident.id
        ]
        (event,) = await store.core_events(kind="deadlock")
        assert event["data"]["incident"] == incident.id
        # escalated, not stopped: both jobs are where they were
        assert (await store.get_job(parent)).state is JobState.RUNNING
        assert (await store.get_job(child)).state is JobState.QUEUED

    anyio.run(main)


def test_no_deadlock_no_incident(tmp_path: Path) -> None:
    settings = config(tmp_path, WORLD.replace("concurrency: 1", "concurrency: 2")).settings

    async def main() -> None:
        store = MemoryStore()
        await parent_and_child(store)  # the child has a free slot: it will run
        assert await WorldWatch(store, settings).look() == []

    anyio.run(main)


def test_a_role_that_says_cancel_has_its_waiting_job_cancelled(tmp_path: Path) -> None:
    text = WORLD.replace("{concurrency: 1}", "{concurrency: 1, on_deadlock: cancel}")
    settings = config(tmp_path, text).settings
    woken: list[bool] = []

    async def main() -> None:
        store = MemoryStore()
        parent, child = await parent_and_child(store)
        watch = WorldWatch(store, settings, clock=lambda: NOW + 5, wake=lambda: woken.append(True))
        (incident,) = await watch.look()
        cancelled = await store.get_job(parent)
        assert cancelled.cancel_requested is not None
        assert cancelled.cancel_requested.startswith("deadlock: ")
        assert woken == [True]
        assert incident.type is IncidentType.DEADLOCK
        assert (await store.get_job(child)).state is JobState.CANCELLED  # it went with it

    anyio.run(main)


def test_on_deadlock_takes_escalate_or_cancel_only(tmp_path: Path) -> None:
    with pytest.raises(CorralError, match="on_deadlock"):
        config(tmp_path, WORLD.replace("{concurrency: 1}", "{on_deadlock: kill}"))
