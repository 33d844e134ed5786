"""Anomaly detection over rolling baselines: per (role, job kind) and metric, the values of the
latest finished attempts (at most `WINDOW`); a live attempt whose value passes `factor` × the
median of at least `MIN_SAMPLES` of them is anomalous.

Metrics: `tool_calls`, `tokens` (in + out), `duration_s`, `cost_usd` per attempt. A job's kind
is its workflow when it has one, else its worker kind (a role often runs several workflows)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from corral.domain.agents import AgentEvent
from corral.domain.models import BASELINE_MIN_SAMPLES, Baseline, Job

METRICS = ("tool_calls", "tokens", "duration_s", "cost_usd")
MIN_SAMPLES = BASELINE_MIN_SAMPLES  # a baseline with fewer says nothing
WINDOW = 50  # the samples a baseline keeps: the latest
DEFAULT_FACTOR = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """A live attempt past its baseline on one metric."""

    job_id: str
    attempt: int
    metric: str
    value: float
    median: float
    factor: float
    samples: int

    def describe(self) -> str:
        return (
            f"{self.metric} {self.value:g} is past {self.factor:g}× the median {self.median:g} "
            f"of the latest {self.samples} attempts of its role and kind"
        )


def kind_of(job: Job) -> str:
    return job.options.workflow or job.worker


def samples_of(event: AgentEvent) -> dict[str, float]:
    """What one finished attempt adds to its baselines (cost only when it is known)."""
    out = {
        "tool_calls": float(len(event.tool_calls)),
        "tokens": float(event.tokens_in + event.tokens_out),
    }
    if event.duration_ms is not None:
        out["duration_s"] = event.duration_ms / 1000.0
    if event.cost_usd is not None:
        out["cost_usd"] = float(event.cost_usd)
    return out


def pushed(
    samples: Sequence[float], values: Iterable[float], window: int = WINDOW
) -> tuple[float, ...]:
    """The samples with `values` added, the oldest dropped past `window`."""
    return (*samples, *values)[-window:]


def check(
    job_id: str,
    attempt: int,
    live: Mapping[str, float],
    baselines: Mapping[str, Baseline],
    factor: float = DEFAULT_FACTOR,
) -> list[Finding]:
    """The metrics on which a live attempt is past `factor` × its baseline's median; none for a
    baseline with too few samples, or a median of 0 (nothing to multiply)."""
    found = []
    for metric, value in sorted(live.items()):
        b = baselines.get(metric)
        if b is None or not b.ready:
            continue
        median = b.median
        if median is None or median <= 0:
            continue
        if value > factor * median:
            found.append(
                Finding(
                    job_id=job_id,
                    attempt=attempt,
                    metric=metric,
                    value=value,
                    median=median,
                    factor=factor,
                    samples=len(b.samples),
                )
            )
    return found
