"""A training job's W&B runs, as `corral show`, `GET /api/v1/jobs/{id}/runs` and the dashboard
show them: each attempt's run (the runner's record on the job's timeline) with the summary,
config and loss curve read from its offline run file (trace/wandbfile.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from corral.core.ports import JobStore
from corral.domain.models import Job, JobEvent
from corral.trace import wandbfile

MAX_POINTS = 500  # a loss curve is thinned to this many points


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingRun:
    attempt: int | None
    run_id: str | None
    method: str | None
    wandb_mode: str | None
    run_file: str | None
    repo_id: str | None
    revision: str | None
    exit_code: int | None
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    loss_metric: str | None = None
    loss: list[tuple[float, float]] = field(default_factory=list)
    error: str | None = None  # why the run file could not be read


def _loss_key(run: wandbfile.Run) -> str | None:
    keys = {k for row in run.history for k in row}
    if "train/loss" in keys:
        return "train/loss"
    losses = sorted(k for k in keys if "loss" in k.lower())
    return losses[0] if losses else None


def thin(
    series: Sequence[tuple[float, float]], most: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most `most` points of a series, evenly taken, the last one kept."""
    if len(series) <= most:
        return list(series)
    step = len(series) / most
    out = [series[int(i * step)] for i in range(most - 1)]
    return [*out, series[-1]]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def run_of(event: JobEvent) -> TrainingRun:
    """One attempt's run: what the runner recorded, and what its run file holds."""
    data = event.data or {}
    code = data.get("exit_code")
    base: dict[str, Any] = {
        "attempt": event.attempt,
        "run_id": _str(data.get("run_id")),
        "method": _str(data.get("method")),
        "wandb_mode": _str(data.get("wandb_mode")),
        "run_file": _str(data.get("run_file")),
        "repo_id": _str(data.get("repo_id")),
        "revision": _str(data.get("revision")),
        "exit_code": code if isinstance(code, int) else None,
    }
    if base["run_file"] is None:
        return TrainingRun(**base, error="the run wrote no W&B run file")
    try:
        run = wandbfile.read(Path(base["run_file"]))
    except wandbfile.RunFileError as err:
        return TrainingRun(**base, error=str(err))
    key = _loss_key(run)
    return TrainingRun(
        **base,
        tags=run.tags,
        config={k: v for k, v in run.config.items() if k != "_wandb"},
        summary={k: v for k, v in run.summary.items() if not k.startswith("_")},
        loss_metric=key,
        loss=thin(run.series(key)) if key else [],
    )


def runs_in(timeline: Sequence[JobEvent]) -> list[TrainingRun]:
    return [run_of(e) for e in timeline if e.kind == "training"]


async def training_runs(store: JobStore, job: Job) -> list[TrainingRun]:
    """The runs of a job (none for a job that is not a training job)."""
    if "training" not in job.options.extra:
        return []
    timeline = [e for _, e in await store.events(job.id)]
    return await anyio.to_thread.run_sync(runs_in, timeline)
