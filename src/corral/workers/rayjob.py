"""What a Corral attempt on a `kind: ray` environment is in Ray: its submission id, the files it
keeps in its attempt directory, its entrypoint and how it is submitted. The environment's
watcher (workers/raywatch.py, inside the core) does the submitting and the following.

- The submission id is derived from the job id and the attempt index, so the same attempt
  always has the same id: a core started again adopts its job by that id, and a second
  submission of it is refused by Ray ("already exists") instead of running it twice.
- The job's environment (its secrets too) never goes into the Ray job's `runtime_env`, whose
  variables Ray hands back in clear from its job API: it is written to a private file in the
  attempt directory that the entrypoint (`corral.workers.rayentry`) reads and deletes before it
  starts the command.
- The byte offset of the job's log copied so far is kept in `ray-log-offset`, so a watcher
  that follows the job again never writes a line twice.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

OFFSET_FILE = "ray-log-offset"
ENV_FILE = "ray-env.json"  # read and deleted by the entrypoint
# The entrypoint runs the engine's own Corral (its path is given), isolated (-I: no PYTHON*
# variable of the job applies) and without site (-S: it needs the standard library only, and
# starts faster: every Ray job of Corral's pays this start).
_BOOT = (
    "import sys; sys.path[:0] = [sys.argv[1]]; "
    "from corral.workers.rayentry import main; sys.exit(main(sys.argv[2:]))"
)
_PATH = str(Path(__file__).resolve().parents[2])
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray submission id of an attempt: the same attempt always has the same id."""
    return f"corral-{job_id}-{attempt}"


def submit(
    client: Any,
    sid: str,
    entrypoint: str,
    resources: Mapping[str, float],
    runtime_env: Mapping[str, Any] | None = None,
) -> bool:
    """Submit the attempt's job with its resources (as entrypoint resources) and the
    environment's default `runtime_env`. False when Ray has the id already: that job is this
    attempt's (a submission made twice), followed, never a second copy."""
    kwargs: dict[str, Any] = {"runtime_env": dict(runtime_env)} if runtime_env else {}
    for name, value in resources.items():
        if name in ("num_cpus", "num_gpus"):
            kwargs[f"entrypoint_{name}"] = value
        elif name == "memory":
            kwargs["entrypoint_memory"] = int(value)
        else:
            kwargs.setdefault("entrypoint_resources", {})[name] = value
    try:
        client.submit_job(
            entrypoint=entrypoint, submission_id=sid, metadata={"corral": "1"}, **kwargs
        )
    except RuntimeError as err:
        if "already exists" not in str(err):
            raise
        return False
    return True


def entrypoint(cwd: str, env_file: Path, command: Sequence[str]) -> str:
    """The Ray job's entrypoint: `rayentry` on the interpreter of the engine, which reads the
    environment file, moves to `cwd` and replaces itself with the command."""
    head = [sys.executable, "-I", "-S", "-c", _BOOT, _PATH]
    return shlex.join([*head, "--env-file", str(env_file), "--cwd", cwd, "--", *command])
