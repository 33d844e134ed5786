"""Filters the dashboard's templates use: times, durations, ids and the throughput chart's
points. Each returns plain text that the template then escapes (autoescaping is on)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import Environment

CHART_W, CHART_H = 240, 48


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


def as_json(value: Mapping[str, Any] | Sequence[Any] | None) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str, ensure_ascii=False)


def install(env: Environment) -> None:
    env.filters.update(when=when, seconds=seconds, short=short, points=points, as_json=as_json)
    env.globals.update(chart_w=CHART_W, chart_h=CHART_H)
