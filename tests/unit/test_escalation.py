"""Escalation: FATAL conditions, their actions by scope, clearing, and restore."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.config_models import parse, resolve
from corral.core.breakers import HALF_OPEN, OPEN
from corral.core.escalation import Escalations
from corral.core.gateway import Core, CoreOptions
from corral.core.permits import BUDGET_EXHAUSTED, CIRCUIT_OPEN, FATAL_MODE
from corral.core.state import CoreState
from corral.domain.errors import InvalidRequest, NotFound
from corral.domain.models import Attempt, AttemptResult, Job
from corral.domain.settings import (
    BreakerSpec,
    CostPeriod,
    EscalationSpec,
    RoleSpec,
    TenantSpec,
)
from corral.domain.states import AttemptState, Fault, Outcome
from tests.unit.test_permits import NOW, failed, granted, make_core, of, ok, refused, run, settings
from tests.unit.test_retry import job

LOST = failed(Outcome.LOST, None)


def esc_core(
    kinds: tuple[str, ...] = ("command", "codex"),
    **spec: Any,
) -> tuple[Core, list[Any]]:
    s = settings(
        roles={"r": RoleSpec(name="r", worker="codex", concurrency=10)},
        escalation=EscalationSpec(**spec),
        breakers=BreakerSpec(min_calls=100, consecutive_failures=100),
    )
    core, events, _ = make_core(s, kinds=kinds)
    return core, events


def codex(i: int | str, **kw: Any) -> Job:
    return job(id=f"j{i}", role="r", worker="codex", **kw)


@pytest.mark.parametrize(
    ("result", "stop_requested", "crash"),
    [
        (LOST, False, True),
        (failed(Outcome.SPAWN_ERROR, 127), False, True),
        (failed(code=None, sig=11), False, True),  # a segfault nobody asked for
        (failed(code=None, sig=15), True, False),  # we asked it to stop
        (failed(code=1), False, False),  # an ordinary failure
        (failed(Outcome.TIMED_OUT, None), False, False),
        (failed(Outcome.CANCELLED, None), False, False),
        # a job's own command that dies of a signal, or names no program, is no worker crash
        (failed(code=None, sig=11, fault=Fault.JOB), False, False),
        (failed(Outcome.SPAWN_ERROR, 127, fault=Fault.JOB), False, False),
        (failed(Outcome.SPAWN_ERROR, None, fault=Fault.CONFIG), False, True),  # no CLI binary
    ],
)
def test_what_counts_as_a_crash(result: AttemptResult, stop_requested: bool, crash: bool) -> None:
    core, _ = esc_core(crash_loop_per_min=1)
    p = granted(core, codex(1))
    if stop_requested:
        core.note_stop_requested("j1", NOW)
    core.complete(p, codex(1), result, NOW)
    assert (core.escalations.isolated("codex") is not None) is crash


def test_a_crash_loop_isolates_the_worker_kind() -> None:
    core, events = esc_core()
    for i in range(4):
        run(core, codex(i), LOST, NOW + i * 10)
    assert not core.escalations.active
    run(core, codex(4), LOST, NOW + 40)  # the fifth crash within one minute
    [e] = core.escalations.export()
    assert (e.scope, e.target, e.reason, e.severity) == (
        "workerKind",
        "codex",
        "crash_loop",
        "fatal",
    )
    [ev] = of(events, "escalation")
    assert ev.state == "open" and ev.data["crashes"] == 5 and ev.data["action"] == "isolate"
    r = refused(core, codex("x"), NOW + 41)
    assert r.reason == FATAL_MODE and e.id in r.message and not r.final
    granted(core, job(id="other", role="r", worker="command"), NOW + 41)


def test_crashes_spread_over_more_than_a_minute_do_not_escalate() -> None:
    core, _ = esc_core()
    for i in range(10):
        run(core, codex(i), LOST, NOW + i * 16)  # at most 4 inside any 60 s
    assert not core.escalations.active


def test_an_isolated_kind_falls_back_like_an_open_breaker() -> None:
    s = settings(
        roles={
            "r": RoleSpec(name="r", worker="codex", concurrency=10, fallback_workers=("claude",))
        },
        escalation=EscalationSpec(crash_loop_per_min=1),
    )
    core, _, _ = make_core(s, kinds=("codex", "claude"))
    run(core, codex(1), LOST, NOW)
    assert granted(core, codex(2), NOW + 1).granted["worker"] == "claude"


def test_one_ghost_is_noted_repeated_ghosts_isolate_the_kind_they_ran_as() -> None:
    core, events = esc_core()
    run(core, codex(1), failed(Outcome.CANCELLED, None), NOW)  # ended; its kind is remembered
    assert core.note_ghosts("j1", [4242, 4243], NOW + 15) is None, "one ghost: that attempt's"
    noted = of(events, "escalation")
    assert [(e.state, e.severity, e.reason) for e in noted] == [
        ("noted", "warning", "ghost_processes")
    ]
    assert noted[0].data["pids"] == [4242, 4243] and noted[0].data["ghosts"] == 1
    assert granted(core, codex(2), NOW + 16).granted["worker"] == "codex", "not isolated"
    assert core.note_ghosts("j1", [4244], NOW + 17) is None
    e = core.note_ghosts("j1", [4245], NOW + 18)  # the third in the window
    assert e is not None and (e.scope, e.target, e.reason) == (
        "workerKind",
        "codex",
        "ghost_processes",
    )
    assert e.data["ghosts"] == 3 and "3 attempts with ghosts in 600s" in e.message
    assert refused(core, codex(3), NOW + 19).reason == FATAL_MODE


def test_ghosts_outside_the_window_never_isolate() -> None:
    core, _ = esc_core(ghost_max=2, ghost_window_s=60.0)
    run(core, codex(1), failed(Outcome.CANCELLED, None), NOW)
    assert core.note_ghosts("j1", [1], NOW) is None
    assert core.note_ghosts("j1", [2], NOW + 61) is None, "the first one left the window"
    assert core.note_ghosts("j1", [3], NOW + 62) is not None


def test_repeated_ghosts_of_unknown_jobs_stop_everything() -> None:
    core, _ = esc_core(ghost_max=2)
    assert core.note_ghosts("never-seen", [7], NOW) is None
    e = core.note_ghosts("never-seen-either", [8], NOW + 1)
    assert e is not None and (e.scope, e.target) == ("global", "*")
    assert refused(core, job(id="any", role="r", worker="command"), NOW).reason == FATAL_MODE


def test_superseded_churn_locks_the_workspace() -> None:
    core, events = esc_core()
    for i in range(4):
        assert core.note_superseded("/repo/a", NOW + i * 10) is None
    core.note_superseded("/repo/b", NOW + 30)
    e = core.note_superseded("/repo/a", NOW + 50)
    assert e is not None and (e.scope, e.target, e.reason) == (
        "workspace",
        "/repo/a",
        "superseded_churn",
    )
    assert of(events, "escalation")[0].data["action"] == "lock"
    r = refused(core, codex(1, workspace="/repo/a"), NOW + 51)
    assert r.reason == FATAL_MODE and "/repo/a" in r.message
    granted(core, codex(2, workspace="/repo/b"), NOW + 51)
    granted(core, codex(3), NOW + 51)


@pytest.mark.parametrize(("queued", "final"), [("wait", False), ("fail", True)])
def test_safe_stop_finish_refuses_everything_and_stops_nothing(queued: str, final: bool) -> None:
    core, _ = esc_core(safe_stop="finish", safe_stop_queued=queued)
    granted(core, codex(1))
    core.escalate("global", "*", "operator_stop", "maintenance", NOW)
    r = refused(core, job(id="j2", role="r", worker="command", priority=0), NOW)
    assert r.reason == FATAL_MODE and r.final is final
    assert core.tick(NOW + 1) == [] and core.safe_stop_cancels() == []


def test_safe_stop_cancel_announces_the_running_jobs_once() -> None:
    core, _ = esc_core(safe_stop="cancel")
    granted(core, codex(1))
    granted(core, codex(2))
    e = core.escalate("global", "*", "operator_stop", "stop the fleet", NOW)
    assert e is not None
    assert core.safe_stop_cancels() == ["j1", "j2"]
    assert core.tick(NOW + 1) == ["j1", "j2"]
    assert core.tick(NOW + 2) == []  # announced once
    assert core.snapshot(NOW + 2)["safe_stop"]["cancels"] == ["j1", "j2"]
    core.clear_escalation(e.id, NOW + 3)
    assert core.safe_stop_cancels() == [] and core.tick(NOW + 4) == []


def test_clear_is_recorded_lifts_the_action_and_resets_the_count() -> None:
    core, events = esc_core()
    for i in range(5):
        run(core, codex(i), LOST, NOW)
    [e] = core.escalations.export()
    cleared = core.clear_escalation(e.id, NOW + 10)
    assert cleared.id == e.id and not core.escalations.active
    last = of(events, "escalation")[-1]
    assert (last.state, last.reason, last.data["id"], last.data["open_s"]) == (
        "cleared",
        "cleared",
        e.id,
        10,
    )
    granted(core, codex("after"), NOW + 10)
    run(core, codex("one-more"), LOST, NOW + 11)  # still in the minute, yet counted afresh
    assert not core.escalations.active
    with pytest.raises(NotFound):
        core.clear_escalation(e.id, NOW + 12)


def test_one_escalation_per_target() -> None:
    esc = Escalations(EscalationSpec(), lambda e: None)
    assert esc.open("workspace", "/w", "x", NOW, "m", {}) is not None
    assert esc.open("workspace", "/w", "y", NOW, "m", {}) is None
    assert esc.open("workspace", "/v", "x", NOW, "m", {}) is not None
    with pytest.raises(ValueError, match="scope"):
        esc.open("planet", "earth", "x", NOW, "m", {})


def test_state_round_trip_resumes_breakers_escalations_and_cost() -> None:
    s = settings(
        roles={"r": RoleSpec(name="r", worker="codex", concurrency=10)},
        breakers=BreakerSpec(consecutive_failures=2, open_s=30),
        tenants={"t": TenantSpec(name="t", cost_allowance_usd=1.0, period=CostPeriod.DAILY)},
    )
    core, _, _ = make_core(s, kinds=("codex", "command"))
    run(core, codex(1), failed(), NOW)
    run(core, codex(2), failed(cost=2.0), NOW)  # breaker opens at NOW, allowance spent
    esc = core.escalate("workspace", "/repo", "operator_lock", "hands off", NOW)
    assert esc is not None
    doc = json.loads(json.dumps(core.state().to_dict()))

    restarted, _, _ = make_core(
        s, kinds=("codex", "command"), options=CoreOptions(state=CoreState.from_dict(doc))
    )
    assert restarted.state() == core.state()
    assert restarted.breakers.state("worker:codex") == OPEN
    assert refused(restarted, codex(3), NOW + 10).reason == CIRCUIT_OPEN
    assert (
        refused(
            restarted, job(id="w", role="r", worker="command", workspace="/repo"), NOW + 10
        ).reason
        == FATAL_MODE
    )
    assert (
        refused(restarted, job(id="c", role="r", worker="command"), NOW + 10).reason
        == BUDGET_EXHAUSTED
    )
    probe = granted(restarted, codex(4, tenant="u"), NOW + 30)  # opened_at survived
    assert probe.breaker == HALF_OPEN
    restarted.complete(probe, codex(4, tenant="u"), ok(), NOW + 31)
    restarted.clear_escalation(esc.id, NOW + 32)
    assert restarted.state().breakers == () and restarted.state().escalations == ()
    with pytest.raises(InvalidRequest):
        CoreState.from_dict({"breakers": [{"state": "OPEN"}]})


def test_escalation_config() -> None:
    text = """
escalation: {crash_loop_per_min: 3, superseded_max: 4, superseded_window_s: 30,
             safe_stop: cancel, safe_stop_queued: fail}
"""
    e = resolve(parse(text, "c.yaml"), "c.yaml").escalation
    assert e == EscalationSpec(
        crash_loop_per_min=3,
        superseded_max=4,
        superseded_window_s=30,
        safe_stop="cancel",
        safe_stop_queued="fail",
    )
    assert resolve(parse("", "c"), "c").escalation == EscalationSpec()


def test_attempts_lost_while_the_control_plane_was_down_blame_nobody() -> None:
    # bench/ W3 found an engine crash with many attempts STARTING isolating `command`
    core, _ = esc_core(crash_loop_per_min=1)
    for i in range(5):
        j = codex(i)
        attempt = Attempt(
            id=f"a{i}",
            job_id=j.id,
            index=1,
            state=AttemptState.STARTING,
            permit_id=f"p{i}",
            deadline_at=NOW + 60,
            created_at=NOW,
            dir="/x",
            engine_id="dead",
        )
        permit, _ = core.adopt(j, attempt, NOW)
        core.complete(permit, j, LOST, NOW)
    assert core.escalations.isolated("codex") is None
    assert core.breakers.get("worker:codex").state != OPEN
    run(core, codex("live"), LOST, NOW + 1)  # lost under the core's own eyes: a crash
    assert core.escalations.isolated("codex") is not None
