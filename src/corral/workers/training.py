"""The training runner: starts the user's unchanged training script with what Corral adds.

    python -m corral.workers.training --method sft --script train.py \
        [--model M] [--dataset D] [--wandb-project P] -- [script arguments …]

`corral submit --training` makes a job that runs this (services/training.py). On a Ray
environment it is the Ray job's entrypoint (workers/raywatch.py); on a local one it runs under the
shim. It adds only environment to the script, which it starts as its child:

- `CORRAL_JOB_ID`, `CORRAL_ATTEMPT` (already the attempt's), `CORRAL_CHECKPOINT_DIR` (the
  attempt's `checkpoints/` unless the job sets it);
- W&B: `WANDB_RUN_ID` = `corral-<job>-<attempt>` (each attempt its own run), `WANDB_MODE`
  offline unless the job's environment sets it, `WANDB_DIR` the attempt's `wandb/` unless set,
  `WANDB_TAGS` with `corral` and the job id,
  `WANDB_SWEEP_PARAM_PATH` a file putting the job id, the attempt and the method in the run's
  config;
- secrets: every variable the job was given as a secret (`CORRAL_SECRET_NAMES`: `--secret-env`
  and the role's and environment's `secret_env`) is taken out of the script's environment and
  put in a sealed anonymous memory file this runner holds open (`CORRAL_SECRETS_FILE`, a
  `/proc/<runner pid>/fd/<n>` path): never on a disk, and gone with the runner however it ends,
  a SIGKILL included; the script reads it with `corral.runtime_script`;
- `CORRAL_TRAINING_RESULT`: where the script records the repo id and revision it pushed.

When the script ends the runner writes `training.json` in the attempt directory (the run id, the
offline run file, the model pushed) for the engine to record on the job, and exits with the
script's exit code. SIGTERM and SIGINT are passed on to the script.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

METHODS = ("sft", "dpo", "grpo")
RECORD = "training.json"  # in the attempt directory, read by the engine (runtime/governor.py)
SECRET_NAMES_ENV = "CORRAL_SECRET_NAMES"
EXIT_CANNOT_RUN = 78


def run_id(job_id: str, attempt: int | str) -> str:
    """The W&B run id of an attempt: the same attempt always has the same run."""
    return f"corral-{job_id}-{attempt}"


def _work_dir() -> Path:
    result = os.environ.get("CORRAL_RESULT_FILE")
    if result and Path(result).parent.is_dir():
        return Path(result).parent
    return Path(tempfile.mkdtemp(prefix="corral-training-"))


def secrets_memfd(data: dict[str, str]) -> int:
    """`data` as JSON in an anonymous memory file, mode 0600 and sealed against any change.
    The caller holds the fd for as long as the script may read it; the script and its children
    open it as `/proc/<caller pid>/fd/<fd>` (close-on-exec: no child inherits the fd itself)."""
    fd = os.memfd_create("corral-secrets", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, 0o600)
        body = json.dumps(data).encode("utf-8", "surrogateescape")
        written = 0
        while written < len(body):
            written += os.write(fd, body[written:])
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return fd


def script_env(
    args: argparse.Namespace,
    work: Path,
    secrets_fd: Callable[[dict[str, str]], int],
    base: dict[str, str],
) -> dict[str, str]:
    """The script's environment: `base` without its secrets, with what Corral adds; the
    secrets go to the memory file `secrets_fd` makes, which this process holds open."""
    env = dict(base)
    names = [n for n in env.get(SECRET_NAMES_ENV, "").split(",") if n]
    secrets = {n: env.pop(n) for n in names if n in env}
    env.pop(SECRET_NAMES_ENV, None)
    secrets_file = f"/proc/{os.getpid()}/fd/{secrets_fd(secrets)}"
    job = env.get("CORRAL_JOB_ID", "local")
    attempt = env.get("CORRAL_ATTEMPT", "1")
    rid = run_id(job, attempt)
    wandb_dir = Path(env.get("WANDB_DIR") or work / "wandb")
    wandb_dir.mkdir(parents=True, exist_ok=True)
    # wandb 0.31 refuses WANDB_CONFIG_PATHS from the environment (a str where it wants a list);
    # the parameter file it reads like a sweep's (`{key: {value: …}}`, JSON is YAML) is merged
    # into the run's config the same way, and no sweep id makes the run a sweep's
    config = work / "wandb-config.json"
    given = {"corral_job_id": job, "corral_attempt": int(attempt), "corral_method": args.method}
    config.write_text(json.dumps({k: {"value": v} for k, v in given.items()}))
    tags = ",".join(t for t in ("corral", f"corral-job-{job}", env.get("WANDB_TAGS", "")) if t)
    env.update(
        CORRAL_SECRETS_FILE=secrets_file,
        CORRAL_TRAINING_RESULT=str(work / "training-result.json"),
        WANDB_RUN_ID=rid,
        WANDB_DIR=str(wandb_dir),
        WANDB_TAGS=tags,
        WANDB_SWEEP_PARAM_PATH=str(config),
    )
    env.setdefault("CORRAL_CHECKPOINT_DIR", str(work / "checkpoints"))
    env.setdefault("WANDB_MODE", "offline")
    if args.wandb_project:
        env.setdefault("WANDB_PROJECT", args.wandb_project)
    return env


def run_file(wandb_dir: Path, rid: str) -> Path | None:
    """The offline run file W&B wrote for run `rid` (the newest, if it ran twice)."""
    found = sorted(
        (wandb_dir / "wandb").glob(f"*-run-*/run-{rid}.wandb"), key=lambda p: p.stat().st_mtime
    )
    return found[-1] if found else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(args: argparse.Namespace, env: dict[str, str], code: int) -> dict[str, Any]:
    """What the engine records on the job for this attempt."""
    rid = env["WANDB_RUN_ID"]
    found = run_file(Path(env["WANDB_DIR"]), rid)
    pushed = _read_json(Path(env["CORRAL_TRAINING_RESULT"]))
    out: dict[str, Any] = {
        "method": args.method,
        "script": args.script,
        "model": args.model,
        "dataset": args.dataset,
        "run_id": rid,
        "wandb_mode": env.get("WANDB_MODE"),
        "run_file": str(found) if found else None,
        "checkpoint_dir": env.get("CORRAL_CHECKPOINT_DIR"),
        "exit_code": code,
    }
    for key in ("repo_id", "revision"):
        if isinstance(pushed.get(key), str):
            out[key] = pushed[key][:500]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-training", description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--script", required=True)
    parser.add_argument("--model")
    parser.add_argument("--dataset")
    parser.add_argument("--wandb-project")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    extra = args.args[1:] if args.args[:1] == ["--"] else args.args
    work = _work_dir()
    script = Path(args.script)
    if not script.is_file():
        from corral.workers.notes import write_note

        write_note(work, error=f"training script {script} does not exist", fault="config")
        print(f"corral-training: {script} does not exist", file=sys.stderr)
        return EXIT_CANNOT_RUN
    command = [args.python, str(script)]
    if args.model:
        command += ["--model", args.model]
    if args.dataset:
        command += ["--dataset", args.dataset]
    command += extra
    held: list[int] = []

    def hold(secrets: dict[str, str]) -> int:
        held.append(secrets_memfd(secrets))
        return held[-1]

    try:
        env = script_env(args, work, hold, dict(os.environ))
        print(
            f"corral: training ({args.method}) {script} as W&B run {env['WANDB_RUN_ID']} "
            f"({env['WANDB_MODE']})",
            flush=True,
        )
        code = _run(command, env)
        rec = record(args, env, code)
    finally:
        for fd in held:
            os.close(fd)
    tmp = work / f"{RECORD}.tmp"
    tmp.write_text(json.dumps(rec) + "\n")
    tmp.replace(work / RECORD)
    if rec.get("repo_id"):
        print(f"corral: model {rec['repo_id']} at revision {rec.get('revision')}", flush=True)
    return code


def _run(command: list[str], env: dict[str, str]) -> int:
    """The script as a child; a SIGTERM or SIGINT to this process is passed on to it."""
    proc = subprocess.Popen(command, env=env)

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    code = proc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
