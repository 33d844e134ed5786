"""Training jobs: `corral submit --training sft|dpo|grpo --script train.py` and the API's
`training` body.

A training job is a command job whose command is the training runner (workers/training.py) with
the user's unchanged script: on a Ray environment it runs as a Ray job, with the environment's
resources, permit, cap, retries, cancel and timeout like every job. What it trains and what it is
compared to are recorded on the job (`options.training`); the W&B run of each attempt and the
model it pushed are recorded by the engine when the attempt ends (runtime/governor.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.domain.errors import InvalidRequest
from corral.services.submissions import SubmitRequest

METHODS = ("sft", "dpo", "grpo")
MAX_WATCHED = 20
DEFAULT_WATCH = ("train/loss",)
DEFAULT_THRESHOLD = 0.10  # a watched metric 10% worse than the baseline's is a regression


def parse_watch(items: Sequence[str]) -> list[dict[str, str]]:
    """`NAME` (lower is better) or `NAME:max` (higher is better; `NAME:min` says it outright)."""
    if len(items) > MAX_WATCHED:
        raise InvalidRequest(f"at most {MAX_WATCHED} watched metrics, got {len(items)}")
    out = []
    for item in items:
        name, sep, goal = item.rpartition(":")
        if not sep or goal not in ("min", "max"):
            name, goal = item, "min"
        if not name or len(name) > 200 or not name.isprintable():
            raise InvalidRequest(f"a watched metric is NAME or NAME:max, got {item!r}")
        out.append({"metric": name, "goal": goal})
    return out


def training_request(
    base: SubmitRequest,
    method: str,
    script: str,
    *,
    model: str | None = None,
    dataset: str | None = None,
    args: Sequence[str] = (),
    compare_to: str | None = None,
    watch: Sequence[str] = (),
    threshold: float | None = None,
    wandb_project: str | None = None,
    python: str | None = None,
) -> SubmitRequest:
    """`base` (role, environment, limits …) made a training job running `script`. A relative
    script is taken from the request's working directory."""
    if method not in METHODS:
        raise InvalidRequest(f"--training is one of {', '.join(METHODS)}, got {method!r}")
    if base.prompt:
        raise InvalidRequest("a training job runs a script, not a prompt")
    for name, value in (("--model", model), ("--dataset", dataset)):
        if value is not None and (not value or len(value) > 500 or not value.isprintable()):
            raise InvalidRequest(f"{name} wants a Hub id or a path, got {value!r}")
    if threshold is not None and not 0 <= threshold <= 100:
        raise InvalidRequest(f"--regression-threshold is a fraction 0 … 100, got {threshold!r}")
    watched = parse_watch(watch or DEFAULT_WATCH) if (watch or compare_to) else []
    if watch and not compare_to:
        raise InvalidRequest("--watch goes with --compare-to JOB")
    if compare_to is not None and (
        not compare_to.strip() or len(compare_to) > 200 or not compare_to.isprintable()
    ):
        raise InvalidRequest(f"--compare-to wants a job id, got {compare_to!r}")
    src = str((Path(base.cwd or ".") / script).resolve())
    command = [python or sys.executable, "-m", "corral.workers.training"]
    command += ["--method", method, "--script", src]
    if model:
        command += ["--model", model]
    if dataset:
        command += ["--dataset", dataset]
    if wandb_project:
        command += ["--wandb-project", wandb_project]
    command += ["--", *args]
    record: dict[str, Any] = {
        "method": method,
        "script": src,
        "model": model,
        "dataset": dataset,
        "args": list(args),
    }
    if compare_to:
        record["compare_to"] = compare_to
        record["watch"] = watched
        record["threshold"] = DEFAULT_THRESHOLD if threshold is None else threshold
    return replace(base, command=tuple(command), worker="command", training=record)
