"""The pre-run gate records a waiting job's decision once per attempt and decision, not on every
dispatch round (runtime/gate.py); the memory store and a fixed clock."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from corral.domain.agents import PolicyEvaluation
from corral.domain.errors import StoreError
from corral.domain.governance import KillSwitch, Pause, ScopeKind
from corral.domain.models import Job
from corral.domain.settings import RoleSpec, Settings
from corral.runtime.gate import PrerunGate
from corral.store.memory import MemoryStore
from tests.unit.test_retry import job

NOW = 1000.0


def settings() -> Settings:
    return Settings(roles={"r": RoleSpec(name="r")}, environments={}, default_role="r")


def _pause(pid: str, scope: ScopeKind, target: str | None) -> Pause:
    return Pause(
        id=pid, scope=scope, target=target, reason="maintenance", created_at=NOW, created_by="op"
    )


async def _round(gate: PrerunGate, jobs: list[Job], at: float) -> None:
    """A dispatch round whose jobs get no permit: the allows are written on their own."""
    await gate.admit(jobs, at)
    await gate.record(gate.take_allowed())


async def _rounds() -> list[tuple[int | None, str, str]]:
    store = MemoryStore()
    await store.open()
    gate = PrerunGate(store, settings(), clock=lambda: NOW)
    waiting = job(attempts=0)
    for i in range(50):  # allowed, but the core refuses its permit (an open breaker): it waits
        await _round(gate, [waiting], NOW + i)
    await store.activate_pause(_pause("p1", ScopeKind.GLOBAL, None))
    gate.stale()
    for i in range(50):
        await _round(gate, [waiting], NOW + 100 + i)
    await store.lift_pause("p1", at=NOW + 200, by="op")
    gate.stale()
    await _round(gate, [waiting], NOW + 201)
    gate.dispatched([waiting.id])  # it started; its second attempt waits again
    for i in range(10):
        await _round(gate, [waiting.with_(attempts=1)], NOW + 300 + i)
    return [(e.attempt, e.verdict, e.reason) for e in await store.policy_evaluations(waiting.id)]


def test_a_waiting_job_is_recorded_once_per_attempt_and_decision() -> None:
    assert anyio.run(_rounds) == [
        (1, "allow", "allowed"),
        (1, "pause", "runner_paused"),
        (1, "allow", "allowed"),  # the decision changed back
        (2, "allow", "allowed"),  # a new attempt
    ]


class _Down(MemoryStore):
    """A store whose policy writes fail while `down`."""

    down = False

    async def append_policy_evaluations(self, evaluations: Sequence[PolicyEvaluation]) -> None:
        if self.down:
            raise StoreError("the store is away")
        await super().append_policy_evaluations(evaluations)


async def _allow_written() -> tuple[list[str], list[str], list[str]]:
    store = _Down()
    await store.open()
    gate = PrerunGate(store, settings(), clock=lambda: NOW)
    waiting = job(attempts=0)
    await gate.admit([waiting], NOW)
    allowed = gate.take_allowed()  # for the attempts' transaction
    written_by_admit = [e.verdict for e in await store.policy_evaluations(waiting.id)]
    store.down = True
    with pytest.raises(StoreError):
        await gate.record(allowed)  # no attempt started, and the write fails: forgotten
    store.down = False
    await _round(gate, [waiting], NOW + 1)  # so the next round writes it
    await _round(gate, [waiting], NOW + 2)  # once
    kept = [e.verdict for e in allowed]
    return kept, written_by_admit, [e.verdict for e in await store.policy_evaluations(waiting.id)]


def test_an_allow_is_left_to_the_attempts_write_and_kept_until_written() -> None:
    kept, written_by_admit, finally_written = anyio.run(_allow_written)
    assert kept == ["allow"] and written_by_admit == []
    assert finally_written == ["allow"]


async def _holds() -> list[bool]:
    store = MemoryStore()
    await store.open()
    gate = PrerunGate(store, settings(), clock=lambda: NOW)
    seen = [await gate.holds_everything(NOW)]  # nothing in force
    await store.activate_pause(_pause("p-role", ScopeKind.ROLE, "r"))
    gate.stale()
    seen.append(await gate.holds_everything(NOW))  # a role's pause: another role may run
    await store.activate_pause(_pause("p-all", ScopeKind.GLOBAL, None))
    gate.stale()
    seen.append(await gate.holds_everything(NOW))  # a global pause: nothing can start
    await store.activate_kill_switch(
        KillSwitch(
            id="k1",
            scope=ScopeKind.TENANT,
            target="t",
            reason="leak",
            created_at=NOW,
            created_by="op",
        )
    )
    gate.stale()
    seen.append(await gate.holds_everything(NOW))  # a switch denies before the pause holds
    await store.lift_kill_switch("k1", at=NOW + 1, by="op")
    await store.lift_pause("p-all", at=NOW + 1, by="op")
    gate.stale()
    seen.append(await gate.holds_everything(NOW + 2))  # resumed
    return seen


def test_only_a_global_pause_with_no_kill_switch_holds_every_job() -> None:
    """What lets the dispatcher skip reading the queue (scheduler/dispatcher.py `_dispatch`):
    no queued job can be admitted, whichever it is."""
    assert anyio.run(_holds) == [False, False, True, False, False]
