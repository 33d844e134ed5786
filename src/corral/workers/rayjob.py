"""The `ray-job` worker: an attempt on a `kind: ray` environment runs as a Ray job.

    corral-shim --term-child-only 1 … -- python -m corral.workers.rayjob --address … \
        --submission-id corral-<job>-<attempt> --dir <attempt dir> -- <command>

Corral keeps the queue, the permits and the record; Ray runs the work. Each attempt is watched
by this small local process, under the shim like any attempt, so everything the engine does for
a local attempt holds for a Ray one: the permit of the environment is held exactly while the
Ray job is in flight (so Corral never submits past `max_inflight` and nothing waits PENDING
inside Ray); the attempt survives an engine crash and is adopted again; its deadline is kept by
the shim even while the engine is down.

What this process does:
- speaks the job server's HTTP API (what Ray's `JobSubmissionClient` wraps; `RestJobs` below)
  and so imports nothing of Ray;
- submits the attempt with a submission id derived from the job id and the attempt index. If
  the id is already known to Ray (this process was started again for the same attempt), it
  follows that job instead of submitting a second copy;
- polls the job's status and copies its log into the attempt's log through its own stdout (so
  it passes the output pump and its redaction), keeping the byte offset it reached in
  `ray-log-offset` so a restart resumes without writing a line twice; after the job ends it
  reads the whole log once more, so the last lines are never lost (Ray's log tail can end
  before the job does);
- on SIGTERM (a cancel, a timeout, a kill) calls `stop_job`, waits for a terminal status and,
  when Ray does not stop the job within the grace, says so in the attempt's error;
- the job's environment (its secrets too) never goes into the Ray job's `runtime_env`, whose
  variables Ray hands back in clear from its job API: it is written to a private file in the
  attempt directory that the entrypoint (`corral.workers.rayentry`) reads and deletes before
  it starts the command;
- exits with the driver's exit code; a failure that is Ray's rather than the command's (the
  cluster cannot be reached, the runtime environment could not be set up, the job supervisor
  died) is written to `worker-note.json` as the worker's fault, so the breaker of the
  environment counts it and the job's own retries are unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.workers import rayauth
from corral.workers.notes import write_note

if TYPE_CHECKING:
    from corral.domain.models import AttemptResult

OFFSET_FILE = "ray-log-offset"
ENV_FILE = "ray-env.json"  # read and deleted by the entrypoint
EXIT_RAY = 70  # the attempt ended because of Ray, not the command (worker-note.json says why)
EXIT_STOPPED = 143  # stopped on request (128 + SIGTERM), as a local command would report
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray submission id of an attempt: the same attempt always has the same id."""
    return f"corral-{job_id}-{attempt}"


def argv(
    *,
    address: str,
    sid: str,
    attempt_dir: Path,
    command: Sequence[str],
    env_keys: Sequence[str],
    grace_s: float,
    resources: Mapping[str, float] | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    python: str | None = None,
) -> list[str]:
    """The local command that runs `command` as a Ray job (what the shim starts)."""
    out = [
        python or sys.executable,
        "-m",
        "corral.workers.rayjob",
        "--address",
        address,
        "--submission-id",
        sid,
        "--dir",
        str(attempt_dir.resolve()),
        "--grace",
        f"{grace_s:g}",
    ]
    for key in env_keys:
        out += ["--pass-env", key]
    for name, value in (resources or {}).items():
        out += ["--resource", f"{name}={value:g}"]
    if runtime_env:
        out += ["--runtime-env", json.dumps(dict(runtime_env), sort_keys=True)]
    return [*out, "--", *command]


class _Stop:
    asked = False


class RestJobs:
    """The four calls of Ray's `JobSubmissionClient` the watcher makes, over the job server's
    HTTP API that the client itself wraps (`/api/jobs/…`), with the client's errors: a
    RuntimeError naming the status (a missing job is a 404; a duplicate submission id a 500
    "already exists"). Importing Ray costs a watcher seconds of start-up per attempt
    (bench/ray.py measured it); this costs nothing."""

    def __init__(self, address: str, timeout: float = 30.0, token: str | None = None) -> None:
        self.base = address.rstrip("/")
        self.timeout = timeout
        self._auth = rayauth.headers(token)  # on every call, as the client sends it

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._auth)
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(
            f"{self.base}{path}", data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")[:2000]
            raise RuntimeError(f"Request failed with status code {err.code}: {text}") from None
        return json.loads(raw) if raw else None

    def get_job_info(self, sid: str) -> Any:
        import types

        info = self._call("GET", f"/api/jobs/{sid}")
        return types.SimpleNamespace(
            status=info.get("status"),
            message=info.get("message"),
            error_type=info.get("error_type"),
            driver_exit_code=info.get("driver_exit_code"),
        )

    def submit_job(self, *, entrypoint: str, submission_id: str, **kwargs: Any) -> str:
        body = {"entrypoint": entrypoint, "submission_id": submission_id, **kwargs}
        return str(self._call("POST", "/api/jobs/", body)["submission_id"])

    def stop_job(self, sid: str) -> bool:
        return bool(self._call("POST", f"/api/jobs/{sid}/stop")["stopped"])

    def get_job_logs(self, sid: str) -> str:
        return str(self._call("GET", f"/api/jobs/{sid}/logs")["logs"])


def _client(address: str, token: str | None = None) -> Any:
    return RestJobs(address, token=token)


def _info(client: Any, sid: str) -> Any | None:
    """The job's info, or None when Ray does not know the id (a 404)."""
    try:
        return client.get_job_info(sid)
    except RuntimeError as err:
        if "404" in str(err) or "does not exist" in str(err):
            return None
        raise


def _submit(
    client: Any,
    sid: str,
    entrypoint: str,
    resources: Mapping[str, float],
    runtime_env: Mapping[str, Any] | None = None,
) -> None:
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
        if "already exists" not in str(err):  # a duplicate id: that job is this attempt
            raise


def _copy_logs(client: Any, sid: str, offset_file: Path, out: Any) -> None:
    """Write what the job logged past the offset reached, then move the offset."""
    try:
        done = int(offset_file.read_text() or 0)
    except (FileNotFoundError, ValueError):
        done = 0
    data = str(client.get_job_logs(sid)).encode()
    if len(data) <= done:
        return
    out.write(data[done:])
    out.flush()
    tmp = offset_file.with_suffix(".tmp")
    tmp.write_text(str(len(data)))
    tmp.replace(offset_file)


def _write_env(path: Path, keys: Sequence[str]) -> None:
    env = {k: os.environ[k] for k in keys if k in os.environ}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(env, f)


def _entrypoint(python: str, env_file: Path, cwd: str, command: Sequence[str]) -> str:
    import shlex

    head = [python, "-m", "corral.workers.rayentry", "--env-file", str(env_file), "--cwd", cwd]
    return shlex.join([*head, "--", *command])


def run(args: argparse.Namespace, command: list[str]) -> int:
    attempt_dir = Path(args.dir)
    stop = _Stop()

    def asked(_sig: int, _frame: object) -> None:
        stop.asked = True

    signal.signal(signal.SIGTERM, asked)
    signal.signal(signal.SIGINT, asked)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    resources = {}
    for item in args.resource:
        name, _, value = item.partition("=")
        resources[name] = float(value)
    sid = args.submission_id
    env_file = attempt_dir / ENV_FILE
    out = sys.stdout.buffer
    token = os.environ.pop(rayauth.WATCHER_ENV, None) or None  # never passed on to the job
    try:
        client = _client(args.address, token)
        info = _info(client, sid)
        if info is None:
            _write_env(env_file, args.pass_env)
            entry = _entrypoint(sys.executable, env_file, os.getcwd(), command)
            _submit(client, sid, entry, resources, json.loads(args.runtime_env or "{}"))
            print(f"corral: submitted Ray job {sid} to {args.address}", file=sys.stderr)
        else:
            print(f"corral: following Ray job {sid} ({info.status})", file=sys.stderr)
    except Exception as err:  # the cluster is the worker: its failure is not the job's
        with contextlib.suppress(FileNotFoundError):
            env_file.unlink()
        return _ray_failed(
            attempt_dir,
            rayauth.scrub(f"cannot submit to the Ray cluster at {args.address}: {err}", token),
        )
    offset_file = attempt_dir / OFFSET_FILE
    stop_sent_at: float | None = None
    failures = 0
    try:
        while True:
            if stop.asked and stop_sent_at is None:
                stop_sent_at = time.monotonic()
                with contextlib.suppress(Exception):
                    client.stop_job(sid)
                print(f"corral: stop asked; stop_job sent to Ray job {sid}", file=sys.stderr)
            try:
                info = client.get_job_info(sid)
                _copy_logs(client, sid, offset_file, out)
                failures = 0
            except Exception as err:
                failures += 1
                if failures >= args.unreachable_polls:
                    return _ray_failed(
                        attempt_dir,
                        rayauth.scrub(
                            f"lost the Ray cluster at {args.address} while following {sid}: {err}",
                            token,
                        ),
                    )
                time.sleep(args.poll)
                continue
            status = str(getattr(info.status, "value", info.status))
            if status in TERMINAL:
                with contextlib.suppress(Exception):
                    _copy_logs(client, sid, offset_file, out)  # the last lines, once it ended
                return _ended(attempt_dir, sid, info, status, stop_sent_at is not None)
            if stop_sent_at is not None and time.monotonic() - stop_sent_at > args.grace:
                write_note(
                    attempt_dir,
                    error=f"Ray job {sid} did not stop within {args.grace:g}s of stop_job "
                    f"(still {status}); it is left to Ray",
                    fault="worker",
                )
                return EXIT_STOPPED
            time.sleep(args.poll)
    finally:
        with contextlib.suppress(FileNotFoundError):
            env_file.unlink()


def _ended(attempt_dir: Path, sid: str, info: Any, status: str, stopped: bool) -> int:
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        if not stopped:
            write_note(attempt_dir, error=f"Ray job {sid} was stopped outside Corral", fault="job")
            return 1
        return EXIT_STOPPED
    code = info.driver_exit_code
    if code not in (None, 0):
        return int(code)
    kind = getattr(info.error_type, "value", info.error_type)
    return _ray_failed(
        attempt_dir,
        f"Ray job {sid} failed ({kind or 'no error type'}): {info.message or ''}".strip(),
    )


def _ray_failed(attempt_dir: Path, message: str) -> int:
    print(f"corral: {message}", file=sys.stderr)
    write_note(attempt_dir, error=message, fault="worker")
    return EXIT_RAY


def reconcile(
    address: str, sid: str, attempt_dir: Path, token: str | None = None
) -> AttemptResult | None:
    """An attempt whose watcher vanished (no shim, no result): what Ray knows of its job. A job
    that ended is collected (its exit code; what it logged after the watcher died stays in
    Ray's job log, unredacted output never reaches the attempt's log); one still
    running is stopped first, so it is never retried while a copy of it runs; None when Ray
    does not know the id (a head restart lost its table, or it was never submitted): the
    attempt is then LOST like a local one, and retried within its bounds."""
    from corral.domain.models import AttemptResult
    from corral.domain.states import Fault, Outcome

    try:
        client = _client(address, token)
        info = _info(client, sid)
    except Exception as err:
        return AttemptResult(
            outcome=Outcome.LOST,
            fault=Fault.WORKER,
            error=rayauth.scrub(
                f"watcher of Ray job {sid} vanished and the cluster cannot be asked: {err}", token
            ),
        )
    if info is None:
        return None
    status = str(getattr(info.status, "value", info.status))
    if status not in TERMINAL:
        with contextlib.suppress(Exception):
            client.stop_job(sid)
        return AttemptResult(
            outcome=Outcome.LOST,
            fault=Fault.WORKER,
            error=f"watcher of Ray job {sid} vanished while it was {status}: stop_job sent",
        )
    # Its log past the offset is not copied here: only the watcher's output passes the
    # redaction of the attempt's output pump. It stays in Ray's job log.
    code = _ended(attempt_dir, sid, info, status, stopped=False)
    return AttemptResult(outcome=Outcome.EXITED, exit_code=code)


def main(argv_: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-rayjob", description=__doc__.split("\n")[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--submission-id", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--unreachable-polls", type=int, default=20)
    parser.add_argument("--pass-env", action="append", default=[])
    parser.add_argument("--resource", action="append", default=[])
    parser.add_argument("--runtime-env")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv_)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    return run(args, command)


if __name__ == "__main__":
    sys.exit(main())
