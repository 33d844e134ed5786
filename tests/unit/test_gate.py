"""The pre-run gate records a waiting job's decision once per attempt and decision, not on every
dispatch round (runtime/gate.py); the memory store and a fixed clock."""

from __future__ import annotations

import anyio

from corral.domain.governance import Pause, ScopeKind
from corral.domain.settings import RoleSpec, Settings
from corral.runtime.gate import PrerunGate
from corral.store.memory import MemoryStore
from tests.unit.test_retry import job

NOW = 1000.0


def settings() -> Settings:
    return Settings(roles={"r": RoleSpec(name="r")}, environments={}, default_role="r")


async def _rounds() -> list[tuple[int | None, str, str]]:
    store = MemoryStore()
    await store.open()
    gate = PrerunGate(store, settings(), clock=lambda: NOW)
    waiting = job(attempts=0)
    for i in range(50):  # allowed, but the core refuses its permit (an open breaker): it waits
        await gate.admit([waiting], NOW + i)
    await store.activate_pause(
        Pause(
            id="p1",
            scope=ScopeKind.GLOBAL,
            target=None,
            reason="maintenance",
            created_at=NOW,
            created_by="op",
        )
    )
    gate.stale()
    for i in range(50):
        await gate.admit([waiting], NOW + 100 + i)
    await store.lift_pause("p1", at=NOW + 200, by="op")
    gate.stale()
    await gate.admit([waiting], NOW + 201)
    gate.dispatched([waiting.id])  # it started; its second attempt waits again
    for i in range(10):
        await gate.admit([waiting.with_(attempts=1)], NOW + 300 + i)
    return [(e.attempt, e.verdict, e.reason) for e in await store.policy_evaluations(waiting.id)]


def test_a_waiting_job_is_recorded_once_per_attempt_and_decision() -> None:
    assert anyio.run(_rounds) == [
        (1, "allow", "allowed"),
        (1, "pause", "runner_paused"),
        (1, "allow", "allowed"),  # the decision changed back
        (2, "allow", "allowed"),  # a new attempt
    ]
