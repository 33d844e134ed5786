"""The watchdog: gauges from the core's own calls, stalls, staged defense."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from corral.config_models import parse, resolve
from corral.core.breakers import CLOSED, OPEN
from corral.core.gateway import Core
from corral.core.permits import BUDGET_EXHAUSTED, FATAL_MODE, GLOBAL_SHED, QUEUE_STALL
from corral.core.watchdog import (
    CANCEL_LATENCY,
    INFLIGHT,
    LOCK_WAIT,
    QUEUE_LAG,
    STALLED,
    TIMEOUT_RATE,
    Watchdog,
    level_of,
)
from corral.domain.errors import ConfigError, InvalidRequest
from corral.domain.models import Job
from corral.domain.settings import BreakerSpec, RoleSpec, Thresholds, WatchdogSpec
from corral.domain.states import Outcome
from tests.unit.test_permits import failed, granted, make_core, of, ok, refused, settings
from tests.unit.test_retry import job

T0 = 10_000.0
SHED_AT = Thresholds(shed=1)


def wjob(id: str, **kw: Any) -> Job:
    """A job queued at T0 (its queue lag is measured from there)."""
    base: dict[str, Any] = dict(role="r", created_at=T0, updated_at=T0, attempts=0)
    base.update(kw)
    return job(id=id, **base)


def wd_core(
    gauges: dict[str, Thresholds], kinds: tuple[str, ...] = ("command",), **spec: Any
) -> tuple[Core, list[Any]]:
    s = settings(
        roles={"r": RoleSpec(name="r", concurrency=4)},
        watchdog=WatchdogSpec(gauges=gauges, **spec),
        breakers=BreakerSpec(min_calls=100, consecutive_failures=100),
    )
    core, events, _ = make_core(s, kinds=kinds)
    return core, events


def stage_events(events: list[Any]) -> list[tuple[str, str]]:
    return [(e.data["from"], e.data["to"]) for e in of(events, "defense") if e.name == "watchdog"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, 0),
        (9.9, 0),
        (10.0, 1),
        (25.0, 2),
        (49.0, 2),
        (50.0, 3),
        (1e9, 4),
    ],
)
def test_level_of(value: float, expected: int) -> None:
    assert level_of(value, Thresholds(shed=10, throttle=20, open=50, escalate=100)) == expected
    assert level_of(value, Thresholds()) == 0


def test_timeout_rate_needs_min_samples_and_forgets_old_results() -> None:
    w = Watchdog(WatchdogSpec(min_samples=4, window_s=60), lambda e: None)
    for i, timed_out in enumerate([True, True, False]):
        w.result("codex", timed_out, T0 + i)
    assert w.values(T0 + 3)[TIMEOUT_RATE] == 0.0  # 3 results: not enough to judge
    w.result("command", False, T0 + 3)
    assert w.values(T0 + 3)[TIMEOUT_RATE] == 0.5
    assert w.values(T0 + 3, "codex")[TIMEOUT_RATE] == 0.0  # codex alone has 3
    assert w.values(T0 + 61)[TIMEOUT_RATE] == 0.0


# ---- each gauge: up to shed and back down, through the Core's own calls -------------------

Feed = Callable[[Core], None]


def feed_inflight(core: Core) -> None:
    granted(core, wjob("i1"), T0)
    granted(core, wjob("i2"), T0)


def cure_inflight(core: Core) -> float:
    for p in core.gate.live_permits():
        core.complete(p, wjob(p.job_id), ok(), T0 + 1)
    return T0 + 1


def feed_lag(core: Core) -> None:
    p = granted(core, wjob("old", created_at=T0 - 30), T0)  # waited 30 s
    core.complete(p, wjob("old"), ok(), T0)


def feed_timeouts(core: Core) -> None:
    for i in range(5):
        p = granted(core, wjob(f"t{i}"), T0)
        core.complete(p, wjob(f"t{i}"), failed(Outcome.TIMED_OUT, None), T0)


def feed_cancel_latency(core: Core) -> None:
    p = granted(core, wjob("c1"), T0)
    core.note_stop_requested("c1", T0)
    core.note_stop_requested("c1", T0 + 1)  # the first request is the one that counts
    core.complete(p, wjob("c1"), failed(Outcome.CANCELLED, None), T0 + 3)


def feed_lock_wait(core: Core) -> None:
    core.report_metric(LOCK_WAIT, 2500.0, T0)


def feed_stall(core: Core) -> None:
    granted(core, wjob("s1"), T0 - 600)
    core.tick(T0 - 1)  # 599 s of silence: not yet


def cure_stall(core: Core) -> float:
    core.note_activity("s1", T0 + 1)
    return T0 + 1


def after(seconds: float) -> Callable[[Core], float]:
    return lambda core: T0 + seconds


@pytest.mark.parametrize(
    ("gauge", "threshold", "feed", "cure", "value"),
    [
        (INFLIGHT, 2, feed_inflight, cure_inflight, 2.0),
        (QUEUE_LAG, 20_000, feed_lag, after(5), 30_000.0),  # samples count for sample_s (5 s)
        (TIMEOUT_RATE, 0.5, feed_timeouts, after(60), 1.0),  # results count for window_s (60 s)
        (CANCEL_LATENCY, 1000, feed_cancel_latency, after(8), 3000.0),
        (LOCK_WAIT, 2000, feed_lock_wait, after(5), 2500.0),
        (STALLED, 1, feed_stall, cure_stall, 1.0),
    ],
)
def test_each_gauge_raises_the_stage_and_recovery_lowers_it(
    gauge: str, threshold: float, feed: Feed, cure: Callable[[Core], float], value: float
) -> None:
    core, events = wd_core({gauge: Thresholds(shed=threshold)})
    feed(core)
    core.tick(T0 + 0.5)
    assert core.watchdog.stage == 1 and core.watchdog.cause == gauge
    [up] = [e for e in of(events, "defense") if e.name == "watchdog"]
    assert (up.state, up.reason, up.data["gauge"], up.data["value"]) == (
        "shed",
        "threshold_exceeded",
        gauge,
        value,
    )
    expected = QUEUE_STALL if gauge == STALLED else GLOBAL_SHED
    assert refused(core, wjob("low", priority=3), T0 + 0.5).reason == expected
    cured = cure(core)
    core.tick(cured)  # under the thresholds from now on …
    core.tick(cured + 9.9)  # … but not yet for recover_s
    assert core.watchdog.stage == 1
    core.tick(cured + 10)
    assert core.watchdog.stage == 0 and core.watchdog.cause is None
    assert stage_events(events) == [("normal", "shed"), ("shed", "normal")]
    granted(core, wjob("low", priority=3), cured + 10)


def test_shed_spares_urgent_work() -> None:
    core, _ = wd_core({LOCK_WAIT: SHED_AT})
    core.report_metric(LOCK_WAIT, 5, T0)
    core.tick(T0)
    r = refused(core, wjob("backlog", priority=4), T0)
    assert r.reason == GLOBAL_SHED and r.retry_after_s == 10.0 and not r.final
    granted(core, wjob("urgent", priority=2), T0)


def test_the_stage_steps_down_one_stage_per_recover_s() -> None:
    core, events = wd_core({LOCK_WAIT: Thresholds(shed=1, throttle=2)})
    core.report_metric(LOCK_WAIT, 2, T0)
    core.tick(T0)
    assert core.watchdog.stage == 2
    for t in (T0 + 5, T0 + 15, T0 + 24.9, T0 + 25):
        core.tick(t)
    assert stage_events(events) == [
        ("normal", "throttle"),
        ("throttle", "shed"),
        ("shed", "normal"),
    ]
    assert [e.at for e in of(events, "defense")][1:] == [T0 + 15, T0 + 25]


@pytest.mark.parametrize(
    ("gauge", "reason"), [(LOCK_WAIT, BUDGET_EXHAUSTED), (STALLED, QUEUE_STALL)]
)
def test_throttle_scales_the_caps_down(gauge: str, reason: str) -> None:
    core, _ = wd_core({gauge: Thresholds(throttle=1)}, throttle_factor=0.5)
    granted(core, wjob("a"), T0)
    granted(core, wjob("b"), T0)
    if gauge == STALLED:
        core.tick(T0 + 600)
    else:
        core.report_metric(gauge, 1, T0 + 600)
        core.tick(T0 + 600)
    assert core.gate.cap_factor == 0.5 and core.gate.full()[0] == frozenset({"r"})
    r = refused(core, wjob("c", priority=0), T0 + 600)  # role r: cap 4 × 0.5 = 2
    assert r.reason == reason and "throttled" in r.message
    for j in ("a", "b"):
        core.note_activity(j, T0 + 601)
    for t in (T0 + 606, T0 + 616):
        core.tick(t)
    assert core.gate.cap_factor == 1.0
    granted(core, wjob("c"), T0 + 616)


def test_stage_open_opens_the_involved_kinds_breakers_and_recovery_closes_them() -> None:
    core, events = wd_core({CANCEL_LATENCY: Thresholds(open=1000)}, kinds=("command", "codex"))
    p = granted(core, wjob("c1", worker="codex"), T0)
    core.note_stop_requested("c1", T0)
    core.complete(p, wjob("c1", worker="codex"), failed(Outcome.KILLED, None), T0 + 2)
    core.tick(T0 + 2)
    assert core.breakers.state("worker:codex") == OPEN
    assert core.breakers.state("worker:command") == CLOSED
    [opened] = of(events, "breaker")
    assert opened.reason == "watchdog_open" and opened.data["gauge"] == CANCEL_LATENCY
    for t in (T0 + 7, T0 + 17):
        core.tick(t)
    assert core.watchdog.stage == 2
    assert core.breakers.state("worker:codex") == CLOSED
    assert of(events, "breaker")[-1].reason == "watchdog_recovered"


@pytest.mark.parametrize(
    ("worker", "scope", "target"),
    [
        ("codex", "workerKind", "codex"),  # attributed: that kind is isolated
        (None, "global", "*"),  # nothing to attribute it to: safe stop
    ],
)
def test_stage_escalate_opens_an_escalation(worker: str | None, scope: str, target: str) -> None:
    core, events = wd_core({LOCK_WAIT: Thresholds(escalate=100)}, kinds=("command", "codex"))
    core.report_metric(LOCK_WAIT, 150, T0, worker=worker)
    core.tick(T0)
    [e] = core.escalations.export()
    assert (e.scope, e.target, e.reason, e.severity) == (
        scope,
        target,
        "watchdog_escalate",
        "critical",
    )
    assert of(events, "escalation")[0].data["gauge"] == LOCK_WAIT
    assert refused(core, wjob("x", worker="codex", priority=0), T0).reason == FATAL_MODE
    core.tick(T0 + 1)
    assert len(core.escalations.export()) == 1  # one escalation, not one per tick


def test_stall_detection() -> None:
    core, events = wd_core({})
    granted(core, wjob("quiet"), T0)
    granted(core, wjob("chatty"), T0)
    core.note_activity("chatty", T0 + 300)
    core.tick(T0 + 599)
    assert not of(events, "defense")
    core.tick(T0 + 600)
    [stall] = of(events, "defense")
    assert (stall.scope, stall.name, stall.reason, stall.state) == (
        "job",
        "quiet",
        "stall_detected",
        "stalled",
    )
    assert stall.data["idle_s"] == 600 and stall.data["worker"] == "command"
    core.tick(T0 + 700)  # reported once
    assert len(of(events, "defense")) == 1
    core.tick(T0 + 900)
    assert [e.name for e in of(events, "defense")] == ["quiet", "chatty"]
    assert core.snapshot(T0 + 900)["watchdog"]["stalled"] == ["chatty", "quiet"]
    core.note_activity("quiet", T0 + 901)
    assert of(events, "defense")[-1].reason == "stall_recovered"
    assert core.watchdog.values(T0 + 901)[STALLED] == 1


def test_report_metric_refuses_unknown_gauges() -> None:
    core, _ = wd_core({})
    with pytest.raises(InvalidRequest, match="unknown metric"):
        core.report_metric("worker_inflight_count", 3, T0)  # the core counts that one itself


def test_watchdog_config() -> None:
    text = """
watchdog:
  stall_s: 120
  recover_s: 3
  shed_min_priority: 2
  throttle_factor: 0.25
  worker_queue_lag_ms: {shed: 5000, throttle: 20000, open: null}
  stalled_attempts: {shed: 1, escalate: 10}
"""
    w = resolve(parse(text, "c.yaml"), "c.yaml").watchdog
    assert (w.stall_s, w.recover_s, w.shed_min_priority, w.throttle_factor) == (120, 3, 2, 0.25)
    assert w.gauges == {
        QUEUE_LAG: Thresholds(shed=5000, throttle=20000),
        STALLED: Thresholds(shed=1, escalate=10),
    }
    assert resolve(parse("", "c"), "c").watchdog == WatchdogSpec()
    with pytest.raises(ConfigError, match=r"watchdog\.worker_lag"):
        parse("watchdog: {worker_lag: {shed: 1}}", "c.yaml")
