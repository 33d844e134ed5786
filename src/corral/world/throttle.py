"""Predictive throttling: refuse a submission while an environment's queue is forecast to
fill, before it is full.

The reading is what the store recorded over the last `window_s` seconds in one environment: the
jobs waiting now, and when each job arrived in the queue and when each attempt started in that
window. Walking back from the depth now (an arrival before `t` was not there yet, a start was
still waiting) gives the depth at evenly spaced instants of the window; a least-squares line
through them is the trend (jobs per second, arrivals net of starts), and the starts alone are
the drain rate. The forecast is the depth `horizon_s` from now on that trend.

Throttling starts when the forecast reaches `threshold` × the cap (the environment's queue
bound) and ends, with hysteresis, only once it is below `release` × the cap: between the two
the previous decision stands. While throttled a submission is refused with a retry-after of the
time the drain rate takes to bring the forecast down to the release level; a submission of
priority 0 passes. Nothing here reads the store or the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from corral.domain.settings import ThrottleSpec

RETRY_AFTER_CEILING_S = 3600.0
POINTS = 12  # instants of the window the depth is reconstructed at
Reason = Literal["throttled", "released", "priority_0", "under_threshold", "still_throttled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """One environment's queue as the store shows it at `now`."""

    now: float
    depth: int  # jobs waiting now (QUEUED, RETRY_WAIT)
    arrivals: Sequence[float]  # when each job of the window entered the queue
    starts: Sequence[float]  # when each attempt of the window started


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    depth: int
    trend_per_s: float  # least-squares slope of the depth over the window
    drain_per_s: float  # attempts started per second over the window
    predicted: float  # the depth horizon_s from now on the trend (at least 0)
    cap: int
    throttle_at: float  # threshold × cap
    release_below: float  # release × cap


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    refuse: bool
    throttled: bool  # the state after this decision (what the next one starts from)
    reason: Reason
    forecast: Forecast
    retry_after_s: float | None = None  # when refused

    @property
    def changed(self) -> bool:
        """Whether this decision starts or ends a throttle (or refuses, or passes priority 0
        through one): the decisions worth a policy evaluation."""
        return self.reason in ("throttled", "released", "priority_0", "still_throttled")

    def inputs(self, spec: ThrottleSpec) -> dict[str, Any]:
        f = self.forecast
        return {
            "depth": f.depth,
            "trend_per_s": round(f.trend_per_s, 4),
            "drain_per_s": round(f.drain_per_s, 4),
            "predicted": round(f.predicted, 2),
            "cap": f.cap,
            "threshold": spec.threshold,
            "release": spec.release,
            "window_s": spec.window_s,
            "horizon_s": spec.horizon_s,
            "retry_after_s": self.retry_after_s,
        }


def depth_series(r: Reading, window_s: float, points: int = POINTS) -> list[tuple[float, float]]:
    """The depth at `points` + 1 instants from `now - window_s` to `now`, walked back from the
    depth now: each arrival after an instant was not waiting yet, each start after it was."""
    out = []
    for i in range(points + 1):
        t = r.now - window_s + window_s * i / points
        later_in = sum(1 for a in r.arrivals if a > t)
        later_out = sum(1 for s in r.starts if s > t)
        out.append((t, max(0.0, float(r.depth - later_in + later_out))))
    return out


def slope(series: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of depth over time (0 for fewer than two instants)."""
    n = len(series)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in series) / n
    md = sum(d for _, d in series) / n
    var = sum((t - mt) ** 2 for t, _ in series)
    if var == 0:
        return 0.0
    return sum((t - mt) * (d - md) for t, d in series) / var


def forecast(r: Reading, spec: ThrottleSpec, cap: int) -> Forecast:
    trend = slope(depth_series(r, spec.window_s))
    drain = sum(1 for s in r.starts if s > r.now - spec.window_s) / spec.window_s
    return Forecast(
        depth=r.depth,
        trend_per_s=trend,
        drain_per_s=drain,
        predicted=max(0.0, r.depth + trend * spec.horizon_s),
        cap=cap,
        throttle_at=spec.threshold * cap,
        release_below=spec.release * cap,
    )


def retry_after_s(f: Forecast, fallback_s: float) -> float:
    """Seconds the drain rate takes to bring the forecast under the release level (whole
    seconds, at least 1); nothing drains: `fallback_s`."""
    if f.drain_per_s <= 0:
        return fallback_s
    wait = (f.predicted - f.release_below) / f.drain_per_s
    return float(min(max(math.ceil(wait), 1), RETRY_AFTER_CEILING_S))


def decide(
    r: Reading,
    spec: ThrottleSpec,
    *,
    cap: int,
    priority: int,
    throttled: bool,
    fallback_s: float,
) -> Decision:
    """Whether to refuse a submission of `priority` now, given whether the environment was
    throttled after the previous decision (see the module docstring)."""
    f = forecast(r, spec, cap)
    if throttled:
        if f.predicted < f.release_below:
            return Decision(refuse=False, throttled=False, reason="released", forecast=f)
        reason: Reason = "still_throttled"
    elif f.predicted >= f.throttle_at:
        reason = "throttled"
    else:
        return Decision(refuse=False, throttled=False, reason="under_threshold", forecast=f)
    if priority == 0:
        return Decision(refuse=False, throttled=True, reason="priority_0", forecast=f)
    return Decision(
        refuse=True,
        throttled=True,
        reason=reason,
        forecast=f,
        retry_after_s=retry_after_s(f, fallback_s),
    )
