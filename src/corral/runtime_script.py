"""What a training script may ask of Corral, inside the job (standard library only: it is
imported by the user's script, inside a Ray job, before anything heavy).

    from corral import runtime_script as rs
    rs.export_secrets()          # HF_TOKEN, WANDB_API_KEY into this process's environment
    token = rs.secret("HF_TOKEN")
    rs.checkpoint_dir(), rs.job_id(), rs.run_id()
    rs.record_model(repo_id="me/model", revision=commit_id)

The training runner (corral.workers.training) starts the script with, in its environment:
`CORRAL_JOB_ID`, `CORRAL_ATTEMPT`, `CORRAL_CHECKPOINT_DIR`, `WANDB_RUN_ID` (the job and the
attempt), `WANDB_MODE` (offline unless the job's environment says otherwise),
`CORRAL_SECRETS_FILE` and `CORRAL_TRAINING_RESULT`. The secrets are only in that file (a sealed
anonymous memory file the runner holds open, gone with it): never on a disk, in the script's argv,
in Ray's `runtime_env` or in the job's record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SECRETS_ENV = "CORRAL_SECRETS_FILE"
RESULT_ENV = "CORRAL_TRAINING_RESULT"
CHECKPOINT_ENV = "CORRAL_CHECKPOINT_DIR"
# the secrets a training script is given by default, when they are declared for the job
KNOWN_SECRETS = ("HF_TOKEN", "WANDB_API_KEY")


class SecretsUnavailable(RuntimeError):
    """The secrets file cannot be read."""


def in_job() -> bool:
    """Whether this process runs as a Corral training job."""
    return bool(os.environ.get("CORRAL_JOB_ID"))


def job_id() -> str | None:
    return os.environ.get("CORRAL_JOB_ID") or None


def attempt() -> int | None:
    value = os.environ.get("CORRAL_ATTEMPT", "")
    return int(value) if value.isdigit() else None


def run_id() -> str | None:
    """The W&B run id of this attempt (`WANDB_RUN_ID`)."""
    return os.environ.get("WANDB_RUN_ID") or None


def checkpoint_dir() -> Path | None:
    value = os.environ.get(CHECKPOINT_ENV)
    return Path(value) if value else None


def secrets() -> dict[str, str]:
    """Every secret Corral gave this job ({} when it gave none)."""
    path = os.environ.get(SECRETS_ENV)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise SecretsUnavailable(f"cannot read Corral's secrets file: {err}") from None
    if not isinstance(data, dict):
        raise SecretsUnavailable("Corral's secrets file is not an object")
    return {str(k): str(v) for k, v in data.items()}


def secret(name: str, default: str | None = None) -> str | None:
    """One secret by name, or `default`."""
    return secrets().get(name, default)


def export_secrets(names: tuple[str, ...] = KNOWN_SECRETS) -> list[str]:
    """Put these secrets into this process's own environment (the Hub and W&B libraries read
    them there); a variable already set is kept. Returns the names set."""
    found = secrets()
    done = []
    for name in names:
        if name in found and name not in os.environ:
            os.environ[name] = found[name]
            done.append(name)
    return done


def record_model(*, repo_id: str, revision: str, **extra: Any) -> None:
    """Tell Corral which model the run pushed: recorded on the job (`corral show`)."""
    path = os.environ.get(RESULT_ENV)
    if not path:
        return
    data = {**extra, "repo_id": str(repo_id), "revision": str(revision)}
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)
