"""No worker starts without a live permit from the gate; caps hold; permits are released."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from corral.core.gateway import Core
from corral.core.permits import BUDGET_EXHAUSTED, DUPLICATE_PERMIT, PermitGate, Rejected
from corral.domain.errors import PermitError
from corral.domain.models import Attempt, Claimed, Permit
from corral.domain.settings import EnvSpec, RoleSpec, Settings
from corral.domain.states import AttemptState
from corral.workers.command import CommandWorker
from tests.unit.test_retry import job

SETTINGS = Settings(roles={"r": RoleSpec(name="r", concurrency=2)},
                    environments={"local": EnvSpec(name="local", max_inflight=3)})


def gate_and_core() -> tuple[PermitGate, Core]:
    gate = PermitGate(SETTINGS)
    return gate, Core(gate, {"command": CommandWorker(gate.validate)})


def claimed(permit: Permit, tmp: Path) -> Claimed:
    j = job(id=permit.job_id, command=("touch", str(tmp / "ran")))
    attempt = Attempt(id="a", job_id=j.id, index=1, state=AttemptState.STARTING,
                      permit_id=permit.id, deadline_at=permit.deadline_at, created_at=0.0,
                      dir=str(tmp / "attempt"), engine_id="e")
    return Claimed(job=j, attempt=attempt, permit=permit)


def test_a_forged_permit_starts_nothing(tmp_path: Path) -> None:
    gate, core = gate_and_core()
    real = gate.request(job(id="j1"), 1, 0.0)
    assert isinstance(real, Permit)
    forged = dataclasses.replace(real, id="p-forged")
    with pytest.raises(PermitError, match="forged"):
        core.launch(claimed(forged, tmp_path))
    stretched = dataclasses.replace(real, deadline_at=real.deadline_at + 3600)
    with pytest.raises(PermitError, match="forged"):
        core.launch(claimed(stretched, tmp_path))
    assert not (tmp_path / "attempt").exists()


def test_a_released_permit_is_dead_even_for_the_adapter_itself(tmp_path: Path) -> None:
    gate, core = gate_and_core()
    permit = gate.request(job(id="j1"), 1, 0.0)
    assert isinstance(permit, Permit)
    gate.release(permit)
    c = claimed(permit, tmp_path)
    with pytest.raises(PermitError, match="not live"):
        core.launch(c)
    with pytest.raises(PermitError, match="not live"):
        core.workers["command"].start(permit, c.job, c.attempt)
    other_gate = PermitGate(SETTINGS)  # a permit from another gate (another key) is foreign
    foreign = other_gate.request(job(id="j2"), 1, 0.0)
    assert isinstance(foreign, Permit)
    with pytest.raises(PermitError):
        core.launch(claimed(foreign, tmp_path))
    assert not (tmp_path / "ran").exists()


def test_caps_and_duplicates_are_refused_with_machine_reasons() -> None:
    gate, _ = gate_and_core()
    p1 = gate.request(job(id="j1", role="r"), 1, 0.0)
    dup = gate.request(job(id="j1", role="r"), 1, 0.0)
    assert isinstance(dup, Rejected) and dup.reason == DUPLICATE_PERMIT
    p2 = gate.request(job(id="j2", role="r"), 1, 0.0)
    full = gate.request(job(id="j3", role="r"), 1, 0.0)
    assert isinstance(full, Rejected) and full.reason == BUDGET_EXHAUSTED
    assert "role r" in full.message
    assert gate.full() == (frozenset({"r"}), frozenset())
    assert isinstance(p1, Permit) and isinstance(p2, Permit)
    gate.release(p1)
    gate.release(p1)  # twice is harmless
    assert gate.held("role", "r") == 1
    assert isinstance(gate.request(job(id="j3", role="r"), 1, 0.0), Permit)


def test_permit_carries_deadline_attempt_and_budget() -> None:
    gate, _ = gate_and_core()
    j = job(id="j9", role="r")
    p = gate.request(j, 3, 100.0)
    assert isinstance(p, Permit)
    assert p.attempt_index == 3 and p.deadline_at == 100.0 + j.limits.timeout_s
    assert dict(p.granted) == {"role": "r", "env": "local", "worker": "command", "tenant": "t"}
    assert p.breaker == "CLOSED" and p.grace_s == j.limits.grace_s
