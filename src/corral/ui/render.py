"""Filters the dashboard's templates use: times, durations, ids and the throughput chart's
points. Each returns plain text that the template then escapes (autoescaping is on)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import Environment

CHART_W, CHART_H = 240, 48
CURVE_W, CURVE_H = 320, 96  # a training run's loss curve


def when(ts: float | None) -> str:
    """A timestamp as UTC `YYYY-MM-DD HH:MM:SS`, or an empty string."""
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def short(job_id: str) -> str:
    return job_id[-12:]


def points(values: Sequence[int]) -> str:
    """The throughput chart's polyline: one point per bucket, scaled to CHART_W × CHART_H."""
    if not values:
        return ""
    top = max(max(values), 1)
    step = CHART_W / max(len(values) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{CHART_H - 2 - (v / top) * (CHART_H - 4):.1f}"
        for i, v in enumerate(values)
    )


def curve(series: Sequence[Sequence[float]]) -> str:
    """A loss curve's polyline: (step, value) pairs scaled to CURVE_W × CURVE_H, the lowest
    value at the bottom."""
    if not series:
        return ""
    xs, ys = [float(p[0]) for p in series], [float(p[1]) for p in series]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    dx, dy = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    return " ".join(
        f"{(x - x0) / dx * (CURVE_W - 4) + 2:.1f},{CURVE_H - 2 - (y - y0) / dy * (CURVE_H - 4):.1f}"
        for x, y in zip(xs, ys, strict=True)
    )


def as_json(value: Mapping[str, Any] | Sequence[Any] | None) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str, ensure_ascii=False)


def install(env: Environment) -> None:
    env.filters.update(
        when=when, seconds=seconds, short=short, points=points, curve=curve, as_json=as_json
    )
    env.globals.update(chart_w=CHART_W, chart_h=CHART_H, curve_w=CURVE_W, curve_h=CURVE_H)
