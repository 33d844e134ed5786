"""Circuit breakers: open on rate or concentration, one half-open probe, fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.config_models import parse, resolve
from corral.core.breakers import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerBoard,
    breaker_names,
    verdict,
)
from corral.core.events import CoreEvent
from corral.core.gateway import CoreOptions
from corral.core.permits import CIRCUIT_OPEN
from corral.domain.errors import NotFound
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, JobOptions, Permit
from corral.domain.settings import BreakerSpec, EnvSpec, RoleSpec, Settings
from corral.domain.states import AttemptState, Fault, Outcome
from tests.unit.test_permits import (
    NOW,
    failed,
    granted,
    make_core,
    of,
    ok,
    refused,
    run,
    settings,
)
from tests.unit.test_retry import job

SPEC = BreakerSpec(window_s=60, min_calls=4, failure_rate=0.5, consecutive_failures=3, open_s=30)
S, F, C = ok(), failed(), AttemptResult(outcome=Outcome.CANCELLED, signal=15)


def board(spec: BreakerSpec = SPEC) -> tuple[BreakerBoard, list[CoreEvent]]:
    events: list[CoreEvent] = []
    return BreakerBoard(spec, events.append), events


def feed(
    b: BreakerBoard,
    results: list[AttemptResult],
    start: float = NOW,
    step: float = 1.0,
    name: str = "worker:codex",
) -> None:
    for i, r in enumerate(results):
        b.record([name], f"p{i}", r, start + i * step)


@pytest.mark.parametrize(
    ("result", "stopped", "expected"),
    [
        (ok(), False, "success"),
        (failed(code=1), False, "failure"),
        (failed(code=None, sig=9), False, "failure"),
        (failed(code=None, sig=15), True, "neutral"),  # we asked it to stop
        (failed(Outcome.TIMED_OUT, None), False, "failure"),
        (failed(Outcome.LOST, None), False, "failure"),
        (failed(Outcome.SPAWN_ERROR, 127), False, "failure"),
        (failed(Outcome.CANCELLED, None), False, "neutral"),
        (failed(Outcome.KILLED, None), False, "neutral"),
        (failed(code=1, fault=Fault.CONFIG), False, "failure"),  # cannot authenticate
        # the job's own failures say the worker works: they count as healthy calls
        (failed(code=3, fault=Fault.JOB), False, "success"),
        (failed(code=None, sig=9, fault=Fault.JOB), False, "success"),
        (failed(Outcome.TIMED_OUT, None, fault=Fault.JOB), False, "success"),
        (failed(Outcome.SPAWN_ERROR, None, fault=Fault.JOB), False, "success"),
        (failed(code=1, fault=None), False, "success"),  # unclassified: never the provider's
    ],
)
def test_verdict(result: AttemptResult, stopped: bool, expected: str) -> None:
    assert verdict(result, stop_requested=stopped) == expected


@pytest.mark.parametrize(
    ("results", "step", "state", "reason"),
    [
        ([F, F, F], 1.0, OPEN, "consecutive_failures"),
        ([F, F], 1.0, CLOSED, None),  # two in a row and below min_calls
        ([S, F, S, F], 1.0, OPEN, "failure_rate"),  # 2 of 4 = 0.5
        ([S, S, S, F, F], 1.0, CLOSED, None),  # 2 of 5 = 0.4
        ([S, F, S, F], 30.0, CLOSED, None),  # 4 calls but never 4 inside one 60 s window
        ([F, F, C, C, F], 1.0, OPEN, "consecutive_failures"),  # cancels neither count nor reset
        ([C, C, C, C, C], 1.0, CLOSED, None),
        ([F, F, S, F, F], 1.0, OPEN, "failure_rate"),  # 4 of 5 failed; the success broke the run
    ],
)
def test_a_closed_breaker_opens_on_rate_or_concentration(
    results: list[AttemptResult], step: float, state: str, reason: str | None
) -> None:
    b, events = board()
    feed(b, results, step=step)
    assert b.state("worker:codex") == state
    assert [e.reason for e in events] == ([reason] if reason else [])
    if reason:
        assert events[0].state == OPEN and events[0].data["failures"] >= 2
        assert events[0].data["to"] == OPEN and events[0].data["from"] == CLOSED


def test_half_open_admits_one_probe_whose_result_decides() -> None:
    b, events = board()
    feed(b, [F, F, F])
    opened = NOW + 2
    assert not b.admits("worker:codex", opened + 29.9)  # still open
    assert b.get("worker:codex").retry_after(opened + 20) == pytest.approx(10.0)
    assert b.admits("worker:codex", opened + 30)
    assert b.state("worker:codex") == HALF_OPEN
    b.begin(["worker:codex"], "probe")
    assert not b.admits("worker:codex", opened + 31)  # one probe at a time
    b.record(["worker:codex"], "old-permit", S, opened + 32)  # not the probe: changes nothing
    assert b.state("worker:codex") == HALF_OPEN
    b.record(["worker:codex"], "probe", S, opened + 33)
    assert b.state("worker:codex") == CLOSED
    assert [e.reason for e in events] == ["consecutive_failures", "open_elapsed", "probe_succeeded"]
    assert b.get("worker:codex").figures(opened + 33)["calls"] == 0  # a fresh start


@pytest.mark.parametrize(
    ("probe_result", "state", "probe_free"),
    [
        (failed(), OPEN, True),
        (failed(Outcome.CANCELLED, None), HALF_OPEN, True),  # says nothing: the next may probe
    ],
)
def test_probe_failure_reopens_and_a_cancelled_probe_frees_the_slot(
    probe_result: AttemptResult, state: str, probe_free: bool
) -> None:
    b, _ = board()
    feed(b, [F, F, F])
    b.admits("worker:codex", NOW + 40)
    b.begin(["worker:codex"], "probe")
    b.record(["worker:codex"], "probe", probe_result, NOW + 41)
    br = b.get("worker:codex")
    assert br.state == state and (br.probe is None) == probe_free
    if state == OPEN:
        assert br.opened_at == NOW + 41 and br.reason == "probe_failed"
        assert not b.admits("worker:codex", NOW + 41 + 29)


def test_a_probe_that_never_started_frees_the_slot() -> None:
    b, _ = board()
    feed(b, [F, F, F])
    b.admits("worker:codex", NOW + 40)
    b.begin(["worker:codex"], "probe")
    b.abandon(["worker:codex"], "probe")
    assert b.admits("worker:codex", NOW + 40)


def test_operator_reset_closes_and_is_recorded() -> None:
    b, events = board()
    feed(b, [F, F, F])
    b.reset("codex", NOW + 5)  # a bare worker kind names its breaker
    assert b.state("worker:codex") == CLOSED
    assert events[-1].reason == "operator_reset" and events[-1].data["was"] == OPEN
    assert [h["to"] for h in b.get("worker:codex").history] == [OPEN, CLOSED]
    with pytest.raises(NotFound):
        b.reset("worker:nope", NOW)


def test_breaker_names_follow_provider_and_model() -> None:
    j = job(options=JobOptions(provider="openai", model="gpt-x"))
    assert breaker_names(j, "codex") == ["worker:codex", "provider:openai", "model:gpt-x"]
    assert breaker_names(job(), "command") == ["worker:command"]


# ---- through the Core --------------------------------------------------------------------


def core_settings(**role: Any) -> Settings:
    return settings(
        roles={"r": RoleSpec(name="r", worker="codex", concurrency=10, **role)}, breakers=SPEC
    )


def codex_job(i: int, **kw: Any) -> Job:
    return job(id=f"j{i}", role="r", worker="codex", **kw)


def test_the_core_opens_on_failures_and_refuses_with_circuit_open() -> None:
    core, events, _ = make_core(core_settings(), kinds=("codex",))
    for i in range(3):
        run(core, codex_job(i), failed(), NOW + i)
    r = refused(core, codex_job(9), NOW + 10)
    assert r.reason == CIRCUIT_OPEN and r.retry_after_s == pytest.approx(22.0)
    [opened] = of(events, "breaker")
    assert (opened.name, opened.scope, opened.state) == ("worker:codex", "worker", OPEN)
    assert opened.data["consecutive"] == 3
    assert of(events, "rejection")[-1].reason == CIRCUIT_OPEN


def test_the_core_lets_exactly_one_probe_through_half_open() -> None:
    core, events, _ = make_core(core_settings(), kinds=("codex",))
    for i in range(3):
        run(core, codex_job(i), failed(), NOW)
    later = NOW + 30
    probe = granted(core, codex_job(10), later)
    assert probe.breaker == HALF_OPEN and "worker:codex=HALF_OPEN" in probe.granted["breakers"]
    assert refused(core, codex_job(11), later).reason == CIRCUIT_OPEN
    assert refused(core, codex_job(12), later + 5).reason == CIRCUIT_OPEN
    core.complete(probe, codex_job(10), ok(), later + 6)
    assert core.breakers.state("worker:codex") == CLOSED
    assert granted(core, codex_job(11), later + 7).breaker == CLOSED
    assert [e.state for e in of(events, "breaker")] == [OPEN, HALF_OPEN, CLOSED]


def test_a_released_probe_lets_the_next_request_probe() -> None:
    core, _, _ = make_core(core_settings(), kinds=("codex",))
    for i in range(3):
        run(core, codex_job(i), failed(), NOW)
    probe = granted(core, codex_job(10), NOW + 30)
    core.release(probe)  # its claim was lost: it never ran, so it proved nothing
    assert granted(core, codex_job(11), NOW + 31).breaker == HALF_OPEN


def test_a_failed_probe_reopens_through_the_core() -> None:
    core, _, _ = make_core(core_settings(), kinds=("codex",))
    for i in range(3):
        run(core, codex_job(i), failed(), NOW)
    run(core, codex_job(10), failed(Outcome.TIMED_OUT, None), NOW + 30)
    assert core.breakers.state("worker:codex") == OPEN
    assert refused(core, codex_job(11), NOW + 31).retry_after_s == pytest.approx(29.0)


def test_reset_through_the_core_lets_permits_through() -> None:
    core, events, _ = make_core(core_settings(), kinds=("codex",))
    for i in range(3):
        run(core, codex_job(i), failed(), NOW)
    core.reset_breaker("worker:codex", NOW + 1)
    granted(core, codex_job(9), NOW + 1)
    assert of(events, "breaker")[-1].reason == "operator_reset"


def test_fallback_goes_to_the_first_closed_kind_the_core_runs(tmp_path: Path) -> None:
    s = core_settings(fallback_workers=("ghost", "claude", "opencode"))
    core, _, adapters = make_core(s, kinds=("codex", "claude", "opencode"))
    for i in range(3):
        run(core, codex_job(i), failed(), NOW)
    p = granted(core, codex_job(9), NOW + 1)
    assert p.granted["worker"] == "claude" and p.granted["requested_worker"] == "codex"
    assert core.gate.held("worker", "claude") == 1
    attempt = Attempt(
        id="a9",
        job_id="j9",
        index=1,
        state=AttemptState.STARTING,
        permit_id=p.id,
        deadline_at=p.deadline_at,
        created_at=NOW,
        dir=str(tmp_path),
        engine_id="e",
    )
    core.launch(Claimed(job=codex_job(9), attempt=attempt, permit=p))
    assert adapters["claude"].started == [("j9", "claude")] and not adapters["codex"].started
    core.complete(p, codex_job(9), failed(), NOW + 2)  # the fallback's own breaker learns
    assert core.breakers.get("worker:claude").figures(NOW + 2)["failures"] == 1
    for i in range(3):  # claude opens too: the next closed kind is opencode
        run(core, codex_job(20 + i), failed(), NOW + 3)
    assert granted(core, codex_job(30), NOW + 4).granted["worker"] == "opencode"


def test_no_closed_fallback_means_circuit_open() -> None:
    s = core_settings(fallback_workers=("claude",))
    core, _, _ = make_core(s, kinds=("codex", "claude"))
    core.breakers.force_open("worker:claude", NOW, "test", {})
    for i in range(3):
        run(core, codex_job(i), failed(), NOW)
    r = refused(core, codex_job(9), NOW + 1)
    assert r.reason == CIRCUIT_OPEN and "no fallback" in r.message


def test_a_provider_breaker_is_shared_across_worker_kinds() -> None:
    s = settings(
        roles={
            "r": RoleSpec(name="r", worker="codex", concurrency=10, fallback_workers=("claude",))
        },
        breakers=SPEC,
    )
    core, _, _ = make_core(s, kinds=("codex", "claude"))
    opts = JobOptions(provider="openai")
    for i in range(3):
        run(core, codex_job(i, options=opts), failed(), NOW)
    assert core.breakers.state("provider:openai") == OPEN
    assert (
        refused(core, job(id="c1", role="r", worker="claude", options=opts), NOW + 1).reason
        == CIRCUIT_OPEN
    )
    assert isinstance(
        core.request_permit(job(id="c2", role="r", worker="claude"), 1, NOW + 1), Permit
    )


def test_breaker_and_fallback_config() -> None:
    text = """
breakers: {window_s: 30, min_calls: 3, failure_rate: 0.25, consecutive_failures: 2, open_s: 9}
roles:
  coder: {worker: codex, fallback_workers: [claude-code, opencode]}
"""
    s = resolve(parse(text, "c.yaml"), "c.yaml")
    assert s.breakers == BreakerSpec(
        window_s=30, min_calls=3, failure_rate=0.25, consecutive_failures=2, open_s=9
    )
    assert s.roles["coder"].fallback_workers == ("claude-code", "opencode")
    assert resolve(parse("", "c"), "c").breakers == BreakerSpec()


def ray_settings() -> Settings:
    return settings(
        breakers=SPEC,
        environments={
            "local": EnvSpec(name="local", max_inflight=100),
            "gpu": EnvSpec(name="gpu", kind="ray", address="http://127.0.0.1:1", max_inflight=4),
        },
    )


def test_an_unreachable_cluster_holds_its_env_breaker_open_until_it_answers() -> None:
    core, events, _ = make_core(ray_settings())
    gpu = job(id="g1", env_name="gpu")
    core.note_cluster("gpu", None, NOW)  # answering from the start: nothing to say
    assert core.breakers.state("env:gpu") == CLOSED and not of(events, "defense")
    core.note_cluster("gpu", "connection refused", NOW + 1)
    assert core.breakers.state("env:gpu") == OPEN
    assert core.breakers.get("env:gpu").reason == "cluster_unreachable"
    # far past open_s, still no probe permit is spent on a cluster known to be down
    r = refused(core, gpu, NOW + 100)
    assert r.reason == CIRCUIT_OPEN and core.breakers.state("env:gpu") == OPEN
    granted(core, job(id="l1"), NOW + 100)  # the local environment goes on
    core.note_cluster("gpu", "connection refused", NOW + 101)  # no news, no event
    [down] = of(events, "defense")
    assert (down.scope, down.name, down.state) == ("cluster", "gpu", "unreachable")
    seen = core.snapshot(NOW + 101)["watchdog"]["clusters"]["gpu"]
    assert seen["reachable"] is False and seen["since"] == NOW + 1
    core.note_cluster("gpu", None, NOW + 102)
    assert core.breakers.state("env:gpu") == CLOSED
    assert of(events, "breaker")[-1].reason == "cluster_reachable"
    assert of(events, "defense")[-1].state == "reachable"
    granted(core, job(id="g2", env_name="gpu"), NOW + 103)


def test_a_cluster_back_leaves_a_breaker_its_failures_opened_to_its_own_probe() -> None:
    core, _, _ = make_core(ray_settings())
    for i in range(3):
        run(core, job(id=f"g{i}", env_name="gpu"), failed(), NOW + i)
    assert core.breakers.get("env:gpu").reason == "consecutive_failures"
    core.note_cluster("gpu", "timed out", NOW + 5)
    core.note_cluster("gpu", None, NOW + 6)
    assert core.breakers.state("env:gpu") == OPEN  # not this probe's to close
    assert granted(core, job(id="g9", env_name="gpu"), NOW + 40).breaker == HALF_OPEN


def test_an_env_breaker_restored_open_for_an_unreachable_cluster_closes_when_it_answers() -> None:
    core, _, _ = make_core(ray_settings())
    core.note_cluster("gpu", "connection refused", NOW)
    state = core.state()
    later, _, _ = make_core(ray_settings(), options=CoreOptions(state=state))
    assert later.breakers.state("env:gpu") == OPEN
    later.note_cluster("gpu", None, NOW + 1)
    assert later.breakers.state("env:gpu") == CLOSED
