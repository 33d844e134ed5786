"""No worker starts without a live permit from the gate; caps hold; permits are released."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from corral.core.events import CoreEvent
from corral.core.gateway import Core, CoreOptions
from corral.core.permits import (
    BUDGET_EXHAUSTED,
    DUPLICATE_PERMIT,
    PERMIT_EXPIRED,
    PERMIT_FORGED,
    PERMIT_RELEASED,
    PERMIT_USED,
    PERMIT_WRONG_ATTEMPT,
    PERMIT_WRONG_JOB,
    REASONS,
    PermitGate,
    Rejected,
)
from corral.core.ports import AttemptRef
from corral.domain.errors import PermitError
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, JobOptions, Limits, Permit
from corral.domain.settings import EnvSpec, RoleSpec, Settings, TenantSpec, WorkerSpec
from corral.domain.states import AttemptState, Fault, JobState, Outcome
from corral.workers.command import CommandWorker
from tests.unit.test_retry import job

SETTINGS = Settings(
    roles={"r": RoleSpec(name="r", concurrency=2)},
    environments={"local": EnvSpec(name="local", max_inflight=3)},
)


def gate_and_core() -> tuple[PermitGate, Core]:
    gate = PermitGate(SETTINGS)
    return gate, Core(gate, {"command": CommandWorker(gate.validate)})


def claimed(permit: Permit, tmp: Path) -> Claimed:
    j = job(id=permit.job_id, command=("touch", str(tmp / "ran")))
    attempt = Attempt(
        id="a",
        job_id=j.id,
        index=1,
        state=AttemptState.STARTING,
        permit_id=permit.id,
        deadline_at=permit.deadline_at,
        created_at=0.0,
        dir=str(tmp / "attempt"),
        engine_id="e",
    )
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


# ---- the Core around the gate: shared fixtures for the mechanism's tests ---------------------

NOW = 1000.0


class FakeHandle:
    def __init__(self, pid: int) -> None:
        self.ref = AttemptRef.local(pid)

    async def wait(self) -> AttemptResult:  # pragma: no cover - never awaited here
        raise AssertionError("not used")

    def stop(self, *, now_kill: bool = False) -> None:  # pragma: no cover
        raise AssertionError("not used")

    def check(self, now: float) -> None:
        pass

    def survivors(self) -> list[int]:  # pragma: no cover
        raise AssertionError("not used")


class FakeAdapter:
    """A worker adapter that starts nothing: it checks the permit and records the start."""

    def __init__(self, kind: str, validate: Callable[[Permit], None]) -> None:
        self.kind = kind
        self.validate = validate
        self.started: list[tuple[str, str]] = []  # (job id, job.worker as the adapter saw it)

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> FakeHandle:
        self.validate(permit)
        self.started.append((job.id, job.worker))
        return FakeHandle(4000 + len(self.started))

    def ready(self) -> None:
        pass

    def adopt(self, job: Job, attempt: Attempt) -> FakeHandle | AttemptResult:
        return FakeHandle(99)


def settings(**changes: Any) -> Settings:
    """Roles `r` (concurrency 10) and `solo` (1), one roomy environment; override anything."""
    base: dict[str, Any] = dict(
        roles={
            "r": RoleSpec(name="r", concurrency=10),
            "solo": RoleSpec(name="solo", concurrency=1),
        },
        environments={"local": EnvSpec(name="local", max_inflight=100)},
    )
    base.update(changes)
    return Settings(**base)


def make_core(
    s: Settings | None = None,
    kinds: Sequence[str] = ("command",),
    options: CoreOptions | None = None,
) -> tuple[Core, list[CoreEvent], dict[str, FakeAdapter]]:
    gate = PermitGate(s or settings())
    adapters = {k: FakeAdapter(k, gate.validate) for k in kinds}
    events: list[CoreEvent] = []
    return Core(gate, adapters, options, on_event=events.append), events, adapters


def ok() -> AttemptResult:
    return AttemptResult(outcome=Outcome.EXITED, exit_code=0)


def failed(
    outcome: Outcome = Outcome.EXITED,
    code: int | None = 1,
    sig: int | None = None,
    cost: float | None = None,
    fault: Fault | None = Fault.WORKER,
) -> AttemptResult:
    """A failed attempt; by default one its worker classified as the worker's own failure."""
    if outcome in (Outcome.CANCELLED, Outcome.KILLED):
        fault = None
    return AttemptResult(outcome=outcome, exit_code=code, signal=sig, cost_usd=cost, fault=fault)


def granted(core: Core, j: Job, now: float = NOW, attempt: int = 1) -> Permit:
    p = core.request_permit(j, attempt, now)
    assert isinstance(p, Permit), p
    return p


def refused(core: Core, j: Job, now: float = NOW) -> Rejected:
    r = core.request_permit(j, 1, now)
    assert isinstance(r, Rejected), r
    return r


def run(core: Core, j: Job, result: AttemptResult, now: float = NOW) -> Permit:
    """One whole attempt through the core: permit, then its result."""
    p = granted(core, j, now)
    core.complete(p, j, result, now)
    return p


def of(events: list[CoreEvent], kind: str) -> list[CoreEvent]:
    return [e for e in events if e.kind == kind]


def test_a_rejection_waits_by_default_and_is_an_event() -> None:
    core, events, _ = make_core()
    granted(core, job(id="j1"))
    dup = refused(core, job(id="j1"))
    assert dup.reason == DUPLICATE_PERMIT and dup.retry_after_s is None and dup.final is False
    [e] = of(events, "rejection")
    assert (e.name, e.reason, e.state, e.data["job_id"]) == (
        "j1",
        DUPLICATE_PERMIT,
        "rejected",
        "j1",
    )
    assert set(REASONS) == {
        "QUEUE_STALL",
        "CIRCUIT_OPEN",
        "RATE_LIMIT",
        "GLOBAL_SHED",
        "FATAL_MODE",
        "DUPLICATE_PERMIT",
        "BUDGET_EXHAUSTED",
        "MAX_ATTEMPTS",
        "ATTEMPT_REPEATED",
        "TIMEOUT_TOO_LONG",
        "RETRY_BUDGET_EXHAUSTED",
    }


def test_core_permit_records_what_it_granted() -> None:
    core, _, _ = make_core()
    p = granted(core, job(id="j1", role="r"))
    assert p.granted["worker"] == "command" and p.granted["tenant"] == "t"
    assert p.granted["slots"] == "role:r=1/10,env:local=1/100,worker:command=1/-,tenant:t=1/-"
    assert p.granted["breakers"] == "worker:command=CLOSED" and p.breaker == "CLOSED"
    assert "requested_worker" not in p.granted and "allowance_usd" not in p.granted


def test_complete_releases_once_and_a_second_complete_changes_nothing() -> None:
    core, _, _ = make_core()
    j = job(id="j1", role="solo")
    p = run(core, j, failed())
    core.complete(p, j, failed(), NOW)  # a duplicate report must not count twice
    assert core.gate.live == 0
    assert core.breakers.get("worker:command").figures(NOW)["calls"] == 1
    assert isinstance(core.request_permit(job(id="j2", role="solo"), 1, NOW), Permit)


def test_release_of_an_unstarted_permit_frees_its_slot_and_feeds_nothing() -> None:
    core, _, _ = make_core()
    p = granted(core, job(id="j1", role="solo"))
    refused(core, job(id="j2", role="solo"))
    core.release(p)
    assert core.breakers.get("worker:command").figures(NOW)["calls"] == 0
    assert core.watchdog.values(NOW)["worker_inflight_count"] == 0
    granted(core, job(id="j2", role="solo"))


@pytest.mark.parametrize(
    ("scope", "spec_changes", "cap"),
    [
        ("worker", {"workers": {"command": WorkerSpec(name="command", max_inflight=2)}}, 2),
        ("tenant", {"tenants": {"t": TenantSpec(name="t", max_inflight=3)}}, 3),
    ],
)
def test_worker_kind_and_tenant_concurrency(
    scope: str, spec_changes: dict[str, Any], cap: int
) -> None:
    core, _, _ = make_core(settings(**spec_changes))
    permits = [granted(core, job(id=f"j{i}", role="r")) for i in range(cap)]
    r = refused(core, job(id="late", role="r"))
    assert r.reason == BUDGET_EXHAUSTED and scope in r.message and r.retry_after_s is None
    assert core.gate.held(scope, "command" if scope == "worker" else "t") == cap
    core.complete(permits[0], job(id="j0", role="r"), ok(), NOW)
    granted(core, job(id="late", role="r"))


def test_queue_filter_names_what_is_full() -> None:
    s = settings(workers={"command": WorkerSpec(name="command", max_inflight=1)})
    core, _, _ = make_core(s)
    granted(core, job(id="j1", role="solo"))
    f = core.queue_filter()
    assert (f.exclude_roles, f.exclude_workers) == (frozenset({"solo"}), frozenset({"command"}))


def test_adopt_counts_the_kind_the_attempt_ran_as(tmp_path: Path) -> None:
    core, _, _ = make_core(kinds=("command", "codex"))
    j = job(id="j1", role="r")
    attempt = Attempt(
        id="a",
        job_id="j1",
        index=1,
        state=AttemptState.RUNNING,
        permit_id="p-old",
        deadline_at=NOW + 60,
        created_at=NOW,
        dir=str(tmp_path),
        engine_id="e",
    )
    permit, found = core.adopt(j, attempt, NOW, worker="codex")
    assert permit.granted["worker"] == "codex" and not isinstance(found, AttemptResult)
    assert core.gate.held("worker", "codex") == 1
    core.complete(permit, j, failed(code=1), NOW)  # it ran as codex: codex's breaker counts
    assert core.breakers.get("worker:codex").figures(NOW)["calls"] == 1


def test_snapshot_is_json() -> None:
    core, _, _ = make_core()
    run(core, job(id="j1"), failed(cost=0.5))
    core.tick(NOW + 1)
    snap = json.loads(json.dumps(core.snapshot()))
    assert snap["breakers"][0]["name"] == "worker:command"
    assert snap["watchdog"]["stage_name"] == "normal"
    assert snap["budgets"]["costs"]["t"]["spent_usd"] == 0.5


# ---- one permit, one attempt: of its own job, once, before its deadline -------------------


def _attempt(
    permit: Permit,
    j: Job,
    *,
    index: int | None = None,
    permit_id: str | None = None,
    job_id: str | None = None,
) -> Attempt:
    return Attempt(
        id="a",
        job_id=job_id or j.id,
        index=permit.attempt_index if index is None else index,
        state=AttemptState.STARTING,
        permit_id=permit_id or permit.id,
        deadline_at=permit.deadline_at,
        created_at=NOW,
        dir="/nonexistent",
        engine_id="e",
    )


def _misuse(core: Core, permit: Permit, j: Job, case: str) -> tuple[Job, Attempt]:
    """The job and attempt a scheduler presents with `permit` in each misuse case."""
    if case == "other job":
        other = job(id="j2", role="r")
        return other, _attempt(permit, other)
    if case == "changed job":
        changed = j.with_(command=("rm", "-rf", "/"))
        return changed, _attempt(permit, changed)
    if case == "other role":
        moved = j.with_(role="solo")
        return moved, _attempt(permit, moved)
    if case == "other attempt":
        return j, _attempt(permit, j, index=2)
    if case == "attempt names another permit":
        return j, _attempt(permit, j, permit_id="p-other")
    raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("other job", PERMIT_WRONG_JOB),
        ("changed job", PERMIT_WRONG_JOB),
        ("other role", PERMIT_WRONG_JOB),
        ("other attempt", PERMIT_WRONG_ATTEMPT),
        ("attempt names another permit", PERMIT_WRONG_ATTEMPT),
    ],
)
def test_a_permit_starts_only_its_own_job_and_attempt(case: str, reason: str) -> None:
    core, _, adapters = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    other, attempt = _misuse(core, p, j, case)
    with pytest.raises(PermitError) as err:
        core.launch(Claimed(job=other, attempt=attempt, permit=p), NOW)
    assert err.value.reason == reason
    assert adapters["command"].started == []
    assert core.gate.live == 1 and core.gate.unused == 1, "the real holder keeps its permit"
    core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    assert adapters["command"].started == [("j1", "command")]


def test_a_permit_starts_one_attempt_once_and_is_dead_after_it() -> None:
    core, _, adapters = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    c = Claimed(job=j, attempt=_attempt(p, j), permit=p)
    core.launch(c, NOW)
    for when in ("while its attempt runs", "after it ended"):
        with pytest.raises(PermitError, match="already") as err:
            core.launch(c, NOW + 1)
        assert err.value.reason == PERMIT_USED, when
        core.complete(p, j, ok(), NOW + 2)
    assert len(adapters["command"].started) == 1 and core.gate.live == 0


def test_the_adapter_still_sees_a_used_permit_as_live_while_its_attempt_runs() -> None:
    core, _, _ = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    core.gate.validate(p)  # the adapter's own check passes: the attempt holds its permit


def test_an_agent_session_added_after_the_permit_is_the_same_job() -> None:
    core, _, adapters = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    resumed = j.with_(options=JobOptions(resume_session="s-1"), attempts=7, state=JobState.STARTING)
    core.launch(Claimed(job=resumed, attempt=_attempt(p, j), permit=p), NOW)
    assert adapters["command"].started == [("j1", "command")]


def test_learnings_injected_after_the_permit_are_the_same_job() -> None:
    """The dispatcher appends the role's learnings after the permit (runtime/flywheel.py)."""
    core, _, adapters = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    given = j.with_(options=JobOptions(knowledge="## Learnings …"), state=JobState.STARTING)
    core.launch(Claimed(job=given, attempt=_attempt(p, j), permit=p), NOW)
    assert adapters["command"].started == [("j1", "command")]


def test_an_unused_permit_lapses_at_its_deadline_frees_its_slot_and_starts_nothing() -> None:
    core, events, adapters = make_core()
    j = job(id="j1", role="solo", limits=Limits(timeout_s=5.0))
    p = granted(core, j)
    assert refused(core, job(id="j2", role="solo")).reason == BUDGET_EXHAUSTED
    core.tick(NOW + 4.9)
    assert core.gate.live == 1
    core.tick(NOW + 5.0)
    assert core.gate.live == 0 and core.gate.held("role", "solo") == 0
    [e] = of(events, "permit")
    assert (e.state, e.reason, e.name, e.data["permit_id"]) == (
        "expired",
        "permit_expired",
        "j1",
        p.id,
    )
    with pytest.raises(PermitError) as err:
        core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW + 5.1)
    assert err.value.reason == PERMIT_EXPIRED and adapters["command"].started == []
    granted(core, job(id="j2", role="solo"), NOW + 5.2)


def test_a_permit_past_its_deadline_starts_nothing_even_before_it_lapses() -> None:
    core, _, adapters = make_core()
    j = job(id="j1", role="r", limits=Limits(timeout_s=5.0))
    p = granted(core, j)
    with pytest.raises(PermitError) as err:
        core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW + 5.0)
    assert err.value.reason == PERMIT_EXPIRED and adapters["command"].started == []


def test_a_used_permit_never_lapses_its_attempt_keeps_its_slot() -> None:
    core, events, _ = make_core()
    j = job(id="j1", role="r", limits=Limits(timeout_s=5.0))
    p = granted(core, j)
    core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    core.tick(NOW + 60)
    assert core.gate.live == 1 and not of(events, "permit")


def test_a_released_permit_says_so_and_a_foreign_one_is_forged() -> None:
    core, _, _ = make_core()
    j = job(id="j1", role="r")
    p = granted(core, j)
    core.release(p)
    with pytest.raises(PermitError) as err:
        core.launch(Claimed(job=j, attempt=_attempt(p, j), permit=p), NOW)
    assert err.value.reason == PERMIT_RELEASED
    with pytest.raises(PermitError) as err:
        core.launch(
            Claimed(job=j, attempt=_attempt(p, j), permit=dataclasses.replace(p, attempt_index=2)),
            NOW,
        )
    assert err.value.reason == PERMIT_FORGED
