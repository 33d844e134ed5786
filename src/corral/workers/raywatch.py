"""One Ray watcher per environment, inside the core: it submits, follows, stops and collects
every attempt the core runs on that environment's cluster, over one kept-alive HTTP session to
its job server.

Why not a process per attempt: starting an interpreter, importing and connecting for each
attempt cost a short Ray job about a third of a second before it was even submitted (its end
came later too), and a local process polling Ray twice per period for each job in flight took
CPU from the cluster on a small host (bench/ray.py). Here an attempt costs no process at all:

- `start` registers the attempt and wakes the watcher's thread, which submits it at once, even
  in the middle of a round of the others (the job's environment goes through a private file
  the entrypoint, `corral.workers.rayentry`, reads and deletes: never through Ray's
  `runtime_env`, which Ray returns in clear);
- every `POLL_S` the thread asks each job in flight its status and copies what it logged, by
  whole lines past the byte offset reached (kept in `ray-log-offset`), through the redactor of
  the attempt's secrets, into the attempt's `stdout.log`; after the job ends it reads the whole
  log once more, so the last lines are never lost (Ray's log tail can end before the job does);
- a cancel, a deadline (checked at every tick of the core) or the output cap sends `stop_job`
  and waits for a terminal status within the grace;
- the watcher is the core's: when the core goes (killed, restarted by its supervisor, or the
  engine killed with it) the Ray jobs run on, and the next core adopts each attempt by its
  submission id and follows it from its log offset (an attempt Ray does not know is lost and
  retried; one that ended meanwhile is collected). A round of the thread that fails is logged
  and the thread goes on; a thread that died is started again by the next call.

A failure that is Ray's rather than the command's (the cluster cannot be reached, the runtime
environment could not be set up, the job supervisor died) is the worker's fault, so the breaker
of the environment counts it and the job's own retries are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.core.ports import AttemptRef
from corral.domain.models import AttemptResult
from corral.domain.states import Fault, Outcome
from corral.policy.redact import Redactor, StreamRedactor
from corral.workers import rayauth
from corral.workers.process import STDERR, STDOUT
from corral.workers.rayjob import ENV_FILE, OFFSET_FILE, TERMINAL, entrypoint, submit

log = logging.getLogger("corral.ray")

POLL_S = 0.5  # how often each job in flight is asked (the period a bare client would poll)
UNREACHABLE_POLLS = 20  # failed rounds in a row before an attempt is lost with its cluster
TIMEOUT_S = 30.0  # one HTTP call
EXIT_RAY = 70  # the attempt ended because of Ray, not the command


class RayError(RuntimeError):
    """The job server's refusal, as `JobSubmissionClient` words it, with its HTTP status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"Request failed with status code {status}: {text}")
        self.status = status


class Session:
    """Ray's job server over one kept-alive HTTP connection (what `JobSubmissionClient` wraps:
    `/api/jobs/…`), with the client's errors: a RuntimeError naming the status (a missing job
    is a 404; a duplicate submission id a 500 "already exists"). A call whose connection broke
    is made once more on a new one. Used by one thread at a time (its watcher's)."""

    def __init__(self, address: str, timeout: float = TIMEOUT_S) -> None:
        url = urllib.parse.urlsplit(address.rstrip("/"))
        self.https = url.scheme == "https"
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port
        self.prefix = url.path
        self.timeout = timeout
        self.token: str | None = None  # sent on every call, as the client sends it
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = rayauth.headers(self.token)
        if data is not None:
            headers["Content-Type"] = "application/json"
        for again in (True, False):
            conn = self._connect()
            try:
                conn.request(method, self.prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError):
                self.close()
                # a kept-alive connection the server closed; every call is safe to make twice
                # (a second submit of the same id is refused as "already exists", a second
                # stop_job of a stopping job does nothing)
                if again:
                    continue
                raise
            if resp.status >= 400:
                text = raw.decode(errors="replace")[:2000]
                raise RayError(resp.status, text)
            return json.loads(raw) if raw else None
        raise AssertionError("unreachable")

    def get_job_info(self, sid: str) -> dict[str, Any] | None:
        """The job's info, or None when Ray does not know the id (a 404)."""
        try:
            info = self.call("GET", f"/api/jobs/{sid}")
        except RayError as err:
            if err.status == 404:  # by its status: a body may say anything
                return None
            raise
        return info if isinstance(info, dict) else {}

    def submit_job(self, *, entrypoint: str, submission_id: str, **kwargs: Any) -> str:
        body = {"entrypoint": entrypoint, "submission_id": submission_id, **kwargs}
        return str(self.call("POST", "/api/jobs/", body)["submission_id"])

    def stop_job(self, sid: str) -> bool:
        return bool(self.call("POST", f"/api/jobs/{sid}/stop")["stopped"])

    def get_job_logs(self, sid: str) -> str:
        return str(self.call("GET", f"/api/jobs/{sid}/logs")["logs"])


@dataclass(slots=True, kw_only=True)
class Spec:
    """What the watcher needs of one attempt."""

    sid: str
    attempt_dir: Path
    command: Sequence[str] = ()
    cwd: str = "."
    env: Mapping[str, str] = field(default_factory=dict)  # into the private file, never Ray
    resources: Mapping[str, float] = field(default_factory=dict)
    runtime_env: Mapping[str, Any] | None = None
    token: str | None = None
    secrets: tuple[str, ...] = ()
    max_bytes: int = 128 << 20
    tail_bytes: int = 1 << 20
    deadline_at: float | None = None
    grace_s: float = 10.0
    adopted: bool = False  # follow a job submitted before; never submit it


class RayAttempt:
    """An attempt that is a Ray job followed by its environment's watcher (no local process)."""

    def __init__(self, watcher: RayWatcher, spec: Spec) -> None:
        self.watcher = watcher
        self.spec = spec
        self.submitted = spec.adopted
        self.started_at = time.time()
        self.stop_reason: str | None = None  # "terminated", "deadline" or "output"
        self.stop_sent_at: float | None = None
        self.stop_grace = spec.grace_s
        self.failures = 0
        self.redactor = StreamRedactor(Redactor(spec.secrets))
        self.written = _offset(spec.attempt_dir) if spec.adopted else 0  # toward the cap
        self._result: AttemptResult | None = None
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def ref(self) -> AttemptRef:
        return AttemptRef("ray", self.spec.sid)

    # ---- the core's side (its event loop) ----------------------------------------------

    async def wait(self) -> AttemptResult:
        event = asyncio.Event()
        with self._lock:
            if self._result is None:
                self._waiters.append((asyncio.get_running_loop(), event))
        if self._result is None:
            await event.wait()
        assert self._result is not None
        return self._result

    def stop(self, *, now_kill: bool = False) -> None:
        self._ask_stop("terminated", 0.0 if now_kill else None)

    def check(self, now: float) -> None:
        deadline = self.spec.deadline_at
        if deadline is not None and now >= deadline:
            self._ask_stop("deadline", None)
        self.watcher.ensure_running()

    def survivors(self) -> list[int]:
        return []  # nothing of it runs on this host

    def _ask_stop(self, reason: str, grace: float | None) -> None:
        self.stop_for(reason, grace)
        self.watcher.wake()

    def stop_for(self, reason: str, grace: float | None = None) -> None:
        """The reason the attempt stops (the first one given stands), and its grace."""
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason
            if grace is not None:
                self.stop_grace = min(self.stop_grace, grace)

    # ---- the watcher's side (its thread) -----------------------------------------------

    @property
    def done(self) -> bool:
        return self._result is not None

    def finish(self, result: AttemptResult) -> None:
        # The job's environment file, if its entrypoint never took it (Ray could not start the
        # job, or a core died between writing it and submitting), is not left behind.
        with contextlib.suppress(OSError):
            (self.spec.attempt_dir / ENV_FILE).unlink(missing_ok=True)
        with self._lock:
            if self._result is not None:
                return
            self._result = result
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a loop that closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def note(self, text: str) -> None:
        """A line of Corral's own in the attempt's stderr.log."""
        line = rayauth.scrub(text, self.spec.token)
        with open(self.spec.attempt_dir / STDERR, "ab") as f:
            f.write(f"corral: {line}\n".encode())


class RayWatcher:
    """The watcher of one Ray environment: one thread, one session, every attempt in flight."""

    def __init__(self, name: str, address: str, poll_s: float = POLL_S) -> None:
        self.name = name
        self.address = address
        self.poll_s = poll_s
        self.session = Session(address)
        self._attempts: dict[str, RayAttempt] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = False
        self.rounds = 0  # for tests: rounds the thread has made

    def run(self, spec: Spec) -> RayAttempt:
        """Follow (and, unless adopted, submit) one attempt from now on."""
        attempt = RayAttempt(self, spec)
        with self._lock:
            self._attempts[spec.sid] = attempt
        self.ensure_running()
        self.wake()
        return attempt

    def wake(self) -> None:
        self._wake.set()

    def ensure_running(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._loop, name=f"corral-ray-{self.name}", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """End the thread after its round (the attempts it follows stay in Ray, and in its
        list: the next call starts a thread again)."""
        self._closing = True
        self.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._closing = False
        self.session.close()

    def _loop(self) -> None:
        """Rounds every `poll_s`, start to start (a round's own calls do not stretch the
        period). An attempt that arrives is submitted at once, also in the middle of a round:
        it never waits for the others to be asked."""
        due = time.monotonic()
        while not self._closing:
            self._wake.wait(max(0.0, due - time.monotonic()))
            if self._closing:
                return
            self._submit_new()
            if time.monotonic() < due:
                continue  # woken for a new attempt: submitted; the round is not due yet
            due = time.monotonic() + self.poll_s
            with self._lock:
                live = [a for a in self._attempts.values() if not a.done]
                self._attempts = {a.spec.sid: a for a in live}
            for attempt in live:
                self._submit_new()
                self._guarded(attempt)
            self.rounds += 1

    def _submit_new(self) -> None:
        if not self._wake.is_set():
            return
        self._wake.clear()
        with self._lock:
            new = [a for a in self._attempts.values() if not a.submitted and not a.done]
        for attempt in new:
            self._guarded(attempt)

    def _guarded(self, attempt: RayAttempt) -> None:
        if attempt.done:
            return
        try:
            self.step(attempt)
        except Exception:  # one attempt's surprise must not stop the others
            log.exception("ray watcher %s: following %s", self.name, attempt.spec.sid)

    # ---- one attempt, one round ----------------------------------------------------------

    def step(self, a: RayAttempt) -> None:
        s = self.session
        s.token = a.spec.token
        if not a.submitted:
            if a.stop_reason is not None:  # stopped before it reached Ray: nothing to stop
                a.finish(self._stopped(a, None))
                return
            self._submit(a)
            return
        if a.stop_reason is not None and a.stop_sent_at is None:
            a.stop_sent_at = time.monotonic()
            with contextlib.suppress(Exception):
                s.stop_job(a.spec.sid)
            a.note(f"stop asked ({a.stop_reason}); stop_job sent to Ray job {a.spec.sid}")
        logs: bytes | None = None
        try:
            info = s.get_job_info(a.spec.sid)
            if info is not None:
                logs = self._copy_logs(a, final=False)
            a.failures = 0
        except Exception as err:
            a.failures += 1
            if a.failures >= UNREACHABLE_POLLS:
                a.finish(
                    self._ray_failed(
                        a,
                        f"lost the Ray cluster at {self.address} while following "
                        f"{a.spec.sid}: {err}",
                    )
                )
            return
        if info is None:  # a head restart lost its table, or it was never submitted
            a.finish(
                AttemptResult(
                    outcome=Outcome.LOST,
                    fault=Fault.WORKER,
                    error=f"Ray does not know job {a.spec.sid} (a head restart loses every "
                    "job, or it was never submitted)",
                    started_at=a.started_at,
                    ended_at=time.time(),
                )
            )
            return
        status = str(info.get("status"))
        if status in TERMINAL:
            with contextlib.suppress(Exception):  # the last lines, from the log just read
                self._copy_logs(a, final=True, data=logs)
            a.finish(self._ended(a, info, status))
            return
        if a.stop_sent_at is not None and time.monotonic() - a.stop_sent_at > a.stop_grace:
            a.finish(
                self._stopped(
                    a,
                    f"Ray job {a.spec.sid} did not stop within {a.stop_grace:g}s of stop_job "
                    f"(still {status}); it is left to Ray",
                )
            )

    def _submit(self, a: RayAttempt) -> None:
        spec, env_file = a.spec, a.spec.attempt_dir / ENV_FILE
        try:
            write_env(env_file, spec.env)
            entry = entrypoint(spec.cwd, env_file, spec.command)
            if submit(self.session, spec.sid, entry, spec.resources, spec.runtime_env):
                a.note(f"submitted Ray job {spec.sid} to {self.address}")
            else:  # a submission made twice (a broken connection): that job is this attempt
                a.note(f"following Ray job {spec.sid}")
        except Exception as err:  # the cluster is the worker: its failure is not the job's
            a.finish(  # which removes the environment file too
                self._ray_failed(a, f"cannot submit to the Ray cluster at {self.address}: {err}")
            )
            return
        a.submitted = True

    def _copy_logs(self, a: RayAttempt, *, final: bool, data: bytes | None = None) -> bytes:
        """Write what the job logged past the offset reached, by whole lines (all of it once the
        job ended), redacted; then move the offset. Past the output cap, stop the job. `data`:
        the whole log as read already this round (else it is read); returned."""
        offset_file = a.spec.attempt_dir / OFFSET_FILE
        done = _offset(a.spec.attempt_dir)
        if data is None:
            data = self.session.get_job_logs(a.spec.sid).encode()
        end = len(data) if final else data.rfind(b"\n", done) + 1
        if end <= done:
            if final:  # what the redactor still holds (an unfinished line), then the tail
                self._write(a, a.redactor.close())
                self._close_log(a, data)
            return data
        if a.stop_reason == "output":  # capped: only its last part is kept, at the end
            piece = b""
        else:
            room = max(0, a.spec.max_bytes - a.written)
            piece = data[done:end][:room]
            if end - done > room:
                a.stop_for("output")  # the watcher's own thread: no wake-up needed
        self._write(a, a.redactor.feed(piece) + (a.redactor.close() if final else b""))
        a.written += len(piece)
        tmp = offset_file.with_suffix(".tmp")
        tmp.write_text(str(end))
        tmp.replace(offset_file)
        if final:
            self._close_log(a, data)
        return data

    def _write(self, a: RayAttempt, out: bytes) -> None:
        if out:
            with open(a.spec.attempt_dir / STDOUT, "ab") as f:
                f.write(out)

    def _close_log(self, a: RayAttempt, data: bytes) -> None:
        """A capped log ends with a marker and the last `tail_bytes` of what the job wrote."""
        if a.stop_reason != "output" or a.written < a.spec.max_bytes:
            return
        tail = data[-a.spec.tail_bytes :]
        cut = tail.find(b"\n")
        tail = tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail
        left_out = len(data) - a.written - len(tail)
        redactor = StreamRedactor(Redactor(a.spec.secrets))
        with open(a.spec.attempt_dir / STDOUT, "ab") as f:
            f.write(
                f"\n[corral: output cap of {a.spec.max_bytes} bytes reached: {max(0, left_out)} "
                f"bytes left out; the last {len(tail)} follow]\n".encode()
            )
            f.write(redactor.feed(tail) + redactor.close())

    def _ended(self, a: RayAttempt, info: Mapping[str, Any], status: str) -> AttemptResult:
        now = time.time()
        if status == "SUCCEEDED" and a.stop_reason != "output":
            return AttemptResult(
                outcome=Outcome.EXITED, exit_code=0, started_at=a.started_at, ended_at=now
            )
        if a.stop_reason is not None and (status == "STOPPED" or a.stop_reason == "output"):
            return self._stopped(a, None)
        if status == "STOPPED":
            return AttemptResult(
                outcome=Outcome.EXITED,
                exit_code=1,
                fault=Fault.JOB,
                error=f"Ray job {a.spec.sid} was stopped outside Corral",
                started_at=a.started_at,
                ended_at=now,
            )
        code = info.get("driver_exit_code")
        if isinstance(code, int) and code != 0:
            return AttemptResult(
                outcome=Outcome.EXITED,
                exit_code=code,
                fault=Fault.JOB,
                started_at=a.started_at,
                ended_at=now,
            )
        kind = info.get("error_type")
        message = info.get("message") or ""
        return self._ray_failed(
            a, f"Ray job {a.spec.sid} failed ({kind or 'no error type'}): {message}".strip()
        )

    def _stopped(self, a: RayAttempt, problem: str | None) -> AttemptResult:
        """The end of an attempt Corral stopped: cancelled, timed out, or at its output cap."""
        now, reason = time.time(), a.stop_reason
        if problem is not None:
            a.note(problem)
        if reason == "deadline":
            error = "deadline reached: Ray job stopped"
            return AttemptResult(
                outcome=Outcome.TIMED_OUT,
                fault=Fault.JOB,
                error=f"{error}; {problem}" if problem else error,
                limit_hit="max_duration_s",
                started_at=a.started_at,
                ended_at=now,
            )
        if reason == "output":
            return AttemptResult(
                outcome=Outcome.EXITED,
                exit_code=1,
                fault=Fault.JOB,
                error="output cap reached: the Ray job was stopped; its log keeps the first "
                "part and the last part of what it wrote",
                limit_hit="output",
                started_at=a.started_at,
                ended_at=now,
            )
        return AttemptResult(
            outcome=Outcome.CANCELLED,
            error=problem,
            started_at=a.started_at,
            ended_at=now,
        )

    def _ray_failed(self, a: RayAttempt, message: str) -> AttemptResult:
        message = rayauth.scrub(message, a.spec.token)
        a.note(message)
        return AttemptResult(
            outcome=Outcome.EXITED,
            exit_code=EXIT_RAY,
            fault=Fault.WORKER,
            error=message,
            started_at=a.started_at,
            ended_at=time.time(),
        )


def _offset(attempt_dir: Path) -> int:
    """How much of the job's log (bytes) was copied before."""
    try:
        return int((attempt_dir / OFFSET_FILE).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_env(path: Path, env: Mapping[str, str]) -> None:
    """The job's environment for its entrypoint: a private file (0600), never on a command
    line nor in Ray's records."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(env), f)


_WATCHERS: dict[tuple[str, str], RayWatcher] = {}
_WATCHERS_LOCK = threading.Lock()


def watcher(name: str, address: str) -> RayWatcher:
    """The process's watcher of a Ray environment (one per name and address)."""
    with _WATCHERS_LOCK:
        found = _WATCHERS.get((name, address))
        if found is None:
            found = _WATCHERS[(name, address)] = RayWatcher(name, address)
        return found
