"""Predictive throttling's pure part (corral.world.throttle), with a fake clock: the depth walked
back from arrivals and starts, the trend and drain rate, a forecast that crosses the threshold
before the queue does, hysteresis on release, priority 0 passing, and the retry-after."""

from __future__ import annotations

import pytest

from corral.domain.settings import ThrottleSpec
from corral.world.throttle import Reading, decide, depth_series, slope

NOW = 1_000.0  # the fake clock
SPEC = ThrottleSpec(threshold=0.8, release=0.5, window_s=60, horizon_s=30)
CAP = 100


def burst(per_s: float, *, depth: int, drain_per_s: float = 0.0) -> Reading:
    """Jobs arriving at `per_s` a second over the whole window, `drain_per_s` of them starting."""
    n_in, n_out = round(per_s * 60), round(drain_per_s * 60)
    return Reading(
        now=NOW,
        depth=depth,
        arrivals=[NOW - 60 + (i + 0.5) * 60 / n_in for i in range(n_in)],
        starts=[NOW - 60 + (i + 0.5) * 60 / n_out for i in range(n_out)],
    )


def test_the_depth_is_walked_back_from_now() -> None:
    r = Reading(now=NOW, depth=5, arrivals=[NOW - 30, NOW - 10], starts=[NOW - 20])
    series = dict(depth_series(r, 60, points=6))
    assert series[NOW] == 5
    assert series[NOW - 20] == 5 - 1 + 0  # the arrival at -10 came later; the start at -20 not
    assert series[NOW - 30] == 5 - 1 + 1  # … and the start at -20 was still waiting
    assert series[NOW - 60] == 5 - 2 + 1


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([(0.0, 0.0), (1.0, 2.0), (2.0, 4.0)], 2.0),
        ([(0.0, 4.0), (1.0, 4.0)], 0.0),
        ([(0.0, 3.0)], 0.0),  # one instant: no trend
        ([(5.0, 1.0), (5.0, 9.0)], 0.0),  # no spread in time: no trend
    ],
)
def test_the_trend_is_a_least_squares_slope(
    points: list[tuple[float, float]], expected: float
) -> None:
    assert slope(points) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("reading", "throttled", "priority", "refuse", "state", "reason"),
    [
        # 1 job/s net for the last minute, 55 waiting: 85 forecast in 30 s ≥ 80, below the cap
        pytest.param(burst(1.0, depth=55), False, 2, True, True, "throttled", id="forecast"),
        pytest.param(burst(1.0, depth=45), False, 2, False, False, "under_threshold", id="under"),
        pytest.param(burst(0.0, depth=79), False, 2, False, False, "under_threshold", id="flat"),
        # arrivals matched by starts: no trend, the queue is not growing
        pytest.param(
            burst(2.0, depth=70, drain_per_s=2.0), False, 2, False, False, "under_threshold"
        ),
        pytest.param(burst(1.0, depth=55), False, 0, False, True, "priority_0", id="prio0"),
        # hysteresis: throttled before, the forecast (65) is between release (50) and threshold
        pytest.param(burst(1.0, depth=35), True, 2, True, True, "still_throttled", id="held"),
        pytest.param(burst(0.0, depth=49), True, 2, False, False, "released", id="released"),
        pytest.param(burst(0.0, depth=60), True, 0, False, True, "priority_0", id="prio0-held"),
    ],
)
def test_decisions(
    reading: Reading, throttled: bool, priority: int, refuse: bool, state: bool, reason: str
) -> None:
    d = decide(reading, SPEC, cap=CAP, priority=priority, throttled=throttled, fallback_s=5)
    assert (d.refuse, d.throttled, d.reason) == (refuse, state, reason)
    assert (d.retry_after_s is not None) == refuse


def test_the_forecast_crosses_before_the_queue_does() -> None:
    """A queue filling at 1 job/s: the forecast reaches 80 % of the cap about 30 s before the
    depth does, and refusals start then, with about 50 waiting."""
    for depth in range(0, CAP + 1):
        r = Reading(
            now=NOW + depth,
            depth=depth,
            arrivals=[NOW + t for t in range(depth) if t > depth - 60],
            starts=[],
        )
        d = decide(r, SPEC, cap=CAP, priority=2, throttled=False, fallback_s=5)
        if d.refuse:
            break
    assert d.refuse and d.reason == "throttled"
    f = d.forecast
    assert f.depth <= 0.8 * CAP - 25  # the queue itself is far from the threshold, let alone full
    assert f.throttle_at <= f.predicted < CAP


def test_the_retry_after_is_the_drain_time_to_the_release_level() -> None:
    # 2/s arriving, 1/s starting: +1/s, 60 waiting: forecast 90, release level 50, drain 1/s
    d = decide(
        burst(2.0, depth=60, drain_per_s=1.0),
        SPEC,
        cap=CAP,
        priority=2,
        throttled=False,
        fallback_s=5,
    )
    assert d.refuse and d.forecast.drain_per_s == pytest.approx(1.0)
    assert d.forecast.predicted == pytest.approx(90, abs=1)
    assert d.retry_after_s == pytest.approx(40, abs=1)
    nothing_drains = decide(
        burst(1.0, depth=60), SPEC, cap=CAP, priority=2, throttled=False, fallback_s=7
    )
    assert nothing_drains.retry_after_s == 7
    inputs = d.inputs(SPEC)
    assert inputs["cap"] == CAP and inputs["retry_after_s"] == d.retry_after_s
    assert set(inputs) >= {"depth", "trend_per_s", "drain_per_s", "predicted", "threshold"}
