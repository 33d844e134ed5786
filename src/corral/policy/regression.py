"""Regression surfacing for training runs (the WandBAgent's job, done mechanically): a run's
final metrics against a baseline run's.

A watched metric has a goal: `min` (lower is better, a loss) or `max` (higher is better, a
reward or an accuracy). Its change is relative to the baseline's value, signed so that positive
is worse: (value − baseline) / |baseline| for `min`, the opposite for `max`; when the baseline is
0 the change is the absolute difference. A change above the threshold is a regression. A metric
either run lacks (or that is not a finite number) is reported as missing, never a regression.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Comparison:
    metric: str
    goal: str  # "min" | "max"
    value: float | None
    baseline: float | None
    change: float | None  # positive: worse
    regressed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "goal": self.goal,
            "value": self.value,
            "baseline": self.baseline,
            "change": self.change,
            "regressed": self.regressed,
        }


def _number(summary: Mapping[str, Any], key: str) -> float | None:
    value = summary.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def compare(
    summary: Mapping[str, Any],
    baseline: Mapping[str, Any],
    watch: Sequence[Mapping[str, str]],
    threshold: float,
) -> list[Comparison]:
    """Each watched metric of `summary` against `baseline`."""
    out = []
    for w in watch:
        metric, goal = str(w.get("metric", "")), str(w.get("goal", "min"))
        value, base = _number(summary, metric), _number(baseline, metric)
        if value is None or base is None:
            out.append(Comparison(metric, goal, value, base, None, False))
            continue
        diff = value - base if goal == "min" else base - value
        change = diff / abs(base) if base != 0 else diff
        out.append(Comparison(metric, goal, value, base, change, change > threshold))
    return out
