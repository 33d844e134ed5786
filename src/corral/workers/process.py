"""Start, find, signal and read the result of `corral-shim`, the C supervisor of one job attempt.

Each attempt owns a directory.  The engine holds an `flock` on `<dir>/lock` while it spawns the
shim, which inherits the lock as fd 3 and keeps it until it exits: *lock held ⇔ shim alive*.  The
shim writes `shim.pid`, `child.pid` and finally `result.json` (atomically), so an engine that
restarts after a crash can tell from the directory alone whether an attempt is still running,
finished (and how), or was lost with its shim (`probe`).

The shim is not the only way to an attempt's processes. `spawn` puts `CORRAL_ATTEMPT_DIR` (the
attempt directory) in the environment of the shim, its job and everything the job starts, so
that an attempt whose shim died (SIGKILL, OOM killer) or stopped answering (SIGSTOP) can still
be found and stopped from outside (`sweep`): a process that left the tree (`setsid`, a double
fork, a parent that died) keeps its environment. Only a process that scrubs its environment
before an exec escapes the marker — but not the attempt's cgroup: where a cgroup v2 hierarchy is
writable (root, or a delegated subtree), each attempt also gets a cgroup of its own (its path in
`<dir>/cgroup`), which the shim is born in (the zygote's) or joins (an exec'd one) before it
starts anything; no process leaves it on its own, and `sweep` empties it (cgroup.kill) before it
removes it. The shim's waiter removes it after the shim ends (`ShimProcess.wait`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import re2

import corral
from corral.domain.errors import WorkerError
from corral.workers import native, privacy, proctab
from corral.workers.zygote import Zygote, ZygoteLost

__all__ = [
    "Output",
    "ProbeResult",
    "ProbeState",
    "ShimProcess",
    "ShimReason",
    "ShimResult",
    "attempt_processes",
    "probe",
    "read_result",
    "spawn",
    "sweep",
]

ShimReason = Literal["exited", "terminated", "deadline", "spawn_error", "output", "lost"]
_REASONS: frozenset[str] = frozenset(
    ("exited", "terminated", "deadline", "spawn_error", "output", "lost")
)

# The attempt directory itself is the lock: held (flock) by the shim for its whole life, so an
# attempt costs no lock file of its own.
SHIM_PID = "shim.pid"
CHILD_PID = "child.pid"
CGROUP = "cgroup"  # the attempt's cgroup directory, when it has one
RESULT = "result.json"
STDOUT = "stdout.log"
STDERR = "stderr.log"

_WAIT_FALLBACK_S = 0.02  # polling period when pidfds are unavailable
_PROBE_PID_WAIT_S = 1.0  # how long a held lock may go without shim.pid before we give up
_LOST_REQUEST_PID_WAIT_S = 10.0  # the same, for a shim whose zygote did not answer in time
# Blocked from the very first instruction of the shim, so an early stop request is queued for its
# signalfd instead of killing it by default action.
_SHIM_SIGMASK = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)

# The output pump (workers/pump.py) runs on the engine's own interpreter, isolated (-I: no
# PYTHON* variable of the job's environment applies) and without site (-S: ~10 ms less per
# start), importing Corral and RE2 from where this process found them.
_PUMP_BOOT = (
    "import sys; sys.path[:0] = sys.argv[1].split(':'); "
    "from corral.workers.pump import main; sys.exit(main(sys.argv[2:]))"
)
_PUMP_PATHS = ":".join(
    dict.fromkeys(str(Path(m.__file__ or "").resolve().parents[1]) for m in (corral, re2))
)
ATTEMPT_ENV = "CORRAL_ATTEMPT_DIR"  # the marker every process of an attempt is started with
_SWEEP_GIVE_UP_S = 10.0  # like the shim's kill_tree: a process stuck in the kernel cannot hang us
# A stop or deadline the shim should have carried out by now: after the grace, this much more
# when the shim is stopped (SIGSTOP: it cannot act), or far more when it runs (its own bounds:
# 10 s to kill the tree, 30 s for the pump to write the logs).
STOPPED_SLACK_S = 2.0
RUNNING_SLACK_S = 60.0
SECRETS_FD = 4  # where the shim finds the secrets its pump redacts (a memfd: never on disk)


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """How an attempt's stdout and stderr reach its logs: through the pump, which redacts
    `secrets` (and credential shapes) and stops the job once it has written more than
    `max_bytes`, keeping the first part and the last `tail_bytes` of each stream."""

    max_bytes: int = 128 << 20
    tail_bytes: int = 1 << 20
    secrets: tuple[str, ...] = ()

    def pump_argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _PUMP_BOOT,
            _PUMP_PATHS,
            "--max-bytes",
            str(self.max_bytes),
            "--tail-bytes",
            str(self.tail_bytes),
        ]
        return argv + (["--secrets-fd", "5"] if self.secrets else [])


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True, kw_only=True)
class ShimResult:
    """What `result.json` says about one attempt (`reason="lost"` if the shim left none)."""

    exit_code: int | None
    signal: int | None
    reason: ShimReason
    started_at_ms: int
    ended_at_ms: int
    child_pid: int
    descendants_killed: int
    error: str | None


_LOST = ShimResult(
    exit_code=None,
    signal=None,
    reason="lost",
    started_at_ms=0,
    ended_at_ms=0,
    child_pid=0,
    descendants_killed=0,
    error="shim vanished without a result",
)


def read_result(attempt_dir: Path) -> ShimResult | None:
    """Parse `<attempt_dir>/result.json`; None if the shim has not written it."""
    try:
        raw = (attempt_dir / RESULT).read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        return _result_from(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise WorkerError(f"malformed {attempt_dir / RESULT}: {exc}") from exc


def _result_from(data: Any) -> ShimResult:
    if not isinstance(data, dict):
        raise TypeError("not an object")

    def integer(key: str, *, nullable: bool = False) -> int | None:
        value = data[key]
        if value is None and nullable:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{key} is not an integer")
        return value

    reason, error = data["reason"], data["error"]
    if reason not in _REASONS:
        raise ValueError(f"unknown reason {reason!r}")
    if error is not None and not isinstance(error, str):
        raise TypeError("error is not a string")
    return ShimResult(
        exit_code=integer("exit_code", nullable=True),
        signal=integer("signal", nullable=True),
        reason=cast(ShimReason, reason),
        started_at_ms=cast(int, integer("started_at_ms")),
        ended_at_ms=cast(int, integer("ended_at_ms")),
        child_pid=cast(int, integer("child_pid")),
        descendants_killed=cast(int, integer("descendants_killed")),
        error=error,
    )


# --------------------------------------------------------------------------- the process handle


class ShimProcess:
    """A running (or finished) shim: spawned by us (`is_child`) or adopted after a restart."""

    __slots__ = (
        "_forced",
        "_result",
        "_stop_at",
        "attempt_dir",
        "deadline_at",
        "grace_s",
        "is_child",
        "leftovers",
        "pid",
        "pidfd",
        "swept",
    )

    def __init__(
        self,
        *,
        pid: int,
        attempt_dir: Path,
        pidfd: int | None,
        is_child: bool,
        deadline_at: float | None = None,
        grace_s: float = 10.0,
    ) -> None:
        self.pid = pid
        self.attempt_dir = attempt_dir
        self.pidfd = pidfd
        self.is_child = is_child  # ours to reap with waitpid, or it stays a zombie
        self.deadline_at = deadline_at  # wall clock; the shim enforces it, `check` checks it
        self.grace_s = grace_s
        self.swept = 0  # processes of the attempt stopped from outside (its shim could not)
        self.leftovers: list[int] = []  # what its cgroup still held after the shim ended
        self._result: ShimResult | None = None
        self._stop_at: float | None = None  # wall clock of the first stop request
        self._forced: tuple[ShimReason, str] | None = None  # why we killed the shim, and how

    def __repr__(self) -> str:
        return f"<ShimProcess pid={self.pid} dir={str(self.attempt_dir)!r} child={self.is_child}>"

    def fileno(self) -> int:
        """The pidfd; it becomes readable when the shim exits (`anyio.wait_readable(proc)`)."""
        if self.pidfd is None:
            raise WorkerError(f"shim {self.pid} has no pidfd")
        return self.pidfd

    def poll(self) -> ShimResult | None:
        """The result if the shim has exited, else None.  Never blocks."""
        if self._result is not None:
            return self._result
        if self.is_child:
            try:
                pid, _status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (e.g. SIGCHLD set to SIG_IGN)
                pid = self.pid
            if pid == 0:
                return None
        elif _lock_held(self.attempt_dir):
            return None
        # The shim renames result.json into place before it exits (and releases the lock).
        self._result = read_result(self.attempt_dir) or _LOST
        return self._result

    async def wait(self) -> ShimResult:
        """Wait (without a thread) until the shim exits and return its result.

        A shim that left no result (killed, or killed by `check`) left its job's processes
        behind: they are swept (`sweep`) before this returns, so that nothing of the attempt is
        alive when its end is reported and a next attempt may start."""
        result = await self._wait_shim()
        if result is _LOST:
            self.swept = await anyio.to_thread.run_sync(sweep, self.attempt_dir)
            result = self._lost_result(result)
            self._result = result
        elif not _drop_cgroup(self.attempt_dir):  # its shim ended, yet something is left in it
            self.leftovers = [p for p in _cgroup_pids(self.attempt_dir) if p != self.pid]
            await anyio.to_thread.run_sync(sweep, self.attempt_dir)
        return result

    def _lost_result(self, lost: ShimResult) -> ShimResult:
        swept = f"{self.swept} process(es) of the attempt stopped by the engine"
        if self._forced is not None:
            reason, why = self._forced
            return ShimResult(
                exit_code=None,
                signal=None,
                reason=reason,
                started_at_ms=0,
                ended_at_ms=round(time.time() * 1000),
                child_pid=0,
                descendants_killed=self.swept,
                error=f"{why}: {swept}",
            )
        return ShimResult(
            exit_code=None,
            signal=None,
            reason="lost",
            started_at_ms=0,
            ended_at_ms=0,
            child_pid=0,
            descendants_killed=self.swept,
            error=f"{lost.error}: {swept}",
        )

    async def _wait_shim(self) -> ShimResult:
        while True:
            result = self.poll()
            if result is not None:
                return result
            if self.pidfd is None:
                await anyio.sleep(_WAIT_FALLBACK_S)
                continue
            await anyio.wait_readable(self.pidfd)
            result = self.poll()
            if result is not None:
                return result
            # Readable but not yet finished by our criteria (cannot happen by the kernel's exit
            # order, but never spin on a level-triggered fd).
            await anyio.sleep(_WAIT_FALLBACK_S)

    def terminate(self) -> None:
        """Ask the shim to stop the job: term signal now, SIGKILL after the grace."""
        self._note_stop(self.grace_s)
        self._signal(signal.SIGTERM)

    def kill_now(self) -> None:
        """Ask the shim to SIGKILL the job and everything it started, skipping the grace."""
        self._note_stop(0.0)
        self._signal(signal.SIGQUIT)

    def _note_stop(self, grace_s: float) -> None:
        due = time.time() - self.grace_s + grace_s  # `check` adds the grace back
        self._stop_at = due if self._stop_at is None else min(self._stop_at, due)

    def check(self, now: float) -> bool:
        """Hold the shim to its word (`now`: wall clock): a stop asked for, or a deadline
        reached, must end the attempt within the grace. A shim that has not by then, and is
        stopped (SIGSTOP: it cannot act) or far past it, is killed with every process of the
        attempt; `wait` then reports the attempt as the shim would have (cancelled, timed out).
        A stopped shim whose job has ended is only continued (SIGCONT), so it reports the job's
        real result. True when the shim was killed."""
        if self._result is not None or self._forced is not None:
            return False
        stat = proctab.read_stat(self.pid)
        if stat is None or not stat.live:
            return False
        stopped = stat.state in ("T", "t")
        slack = STOPPED_SLACK_S if stopped else RUNNING_SLACK_S
        late: tuple[ShimReason, str] | None = None
        if self._stop_at is not None and now >= self._stop_at + self.grace_s + slack:
            late = ("terminated", "the stop was not carried out")
        elif self.deadline_at is not None and now >= self.deadline_at + self.grace_s + slack:
            late = ("deadline", "deadline reached")
        if late is None:
            if stopped and not self._job_alive():
                self._signal(signal.SIGCONT)  # the job is over: let the shim report it
            return False
        how = "stopped (SIGSTOP)" if stopped else "not answering"
        self._forced = (
            late[0],
            f"{late[1]}, but corral-shim {self.pid} was {how}: the engine killed it",
        )
        self._signal(signal.SIGKILL)
        return True

    def _job_alive(self) -> bool:
        try:
            child = int((self.attempt_dir / CHILD_PID).read_text())
        except (OSError, ValueError):
            return True  # not started yet, as far as we can tell
        return proctab.alive(child)

    def _signal(self, sig: int) -> None:
        if self._result is not None:  # reaped: the pid may belong to someone else by now
            return
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def close(self) -> None:
        """Release the pidfd (the shim keeps running)."""
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (AttributeError, OSError):  # Python/kernel without pidfds: wait() polls instead
        return None


def _open_high(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open O_CLOEXEC at fd >= 4, so the dup2s onto 0-3 in file_actions can never collide."""
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    if fd >= 4:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 4)
    finally:
        os.close(fd)


def spawn(
    *,
    attempt_dir: Path,
    argv: Sequence[str],
    cwd: str | None,
    env: Mapping[str, str],
    grace_s: float,
    deadline_epoch_s: float | None,
    term_signal: int = signal.SIGTERM,
    term_child_only: bool = False,
    output: Output | None = None,
    via: Zygote | None = None,
) -> ShimProcess:
    """Start `argv` under a new shim for `attempt_dir` and return its handle.

    The shim runs in its own session with stdin=/dev/null, stdout/stderr appended to the
    attempt's log files and the attempt lock at fd 3.  `deadline_epoch_s` (wall clock) is
    enforced by the shim itself, so it holds even if the engine dies.  The job's own output
    goes through the shim's pump (`output`), never straight to the logs; the job runs with the
    umask Corral was started with (privacy.job_umask), not Corral's private one. With `via`,
    the shim is forked by that zygote instead of exec'd here (workers/zygote.py).
    """
    output = output or Output()
    if not argv:
        raise WorkerError("cannot spawn an empty command")
    exe = str(native.shim_path())
    fresh = _make_dir(attempt_dir)
    real = _real(attempt_dir)
    env = {**env, ATTEMPT_ENV: real}
    options = _shim_options(
        grace_s=grace_s,
        term_signal=term_signal,
        term_child_only=term_child_only,
        cwd=cwd,
        deadline_epoch_s=deadline_epoch_s,
        output=output,
    )
    fds: list[int] = []  # ours, closed once the shim holds its copies (and the lock)
    try:
        child_fds, cgroup = _claim(attempt_dir, real, fresh, output, fds)
        if cgroup is not None:
            options += ["--cgroup", str(cgroup)]
        started = _start(exe, [exe, *options, str(attempt_dir), "--", *argv], env, child_fds, via)
    except OSError as exc:
        raise WorkerError(f"cannot start corral-shim for {attempt_dir}: {exc}") from exc
    finally:
        for fd in fds:
            os.close(fd)
    if started is None:  # the zygote went away after the request: did it fork the shim?
        found = _after_lost_request(attempt_dir, deadline_epoch_s, grace_s)
        if found is not None:
            return found
        return spawn(  # none was started: exec'd here this time
            attempt_dir=attempt_dir,
            argv=argv,
            cwd=cwd,
            env=env,
            grace_s=grace_s,
            deadline_epoch_s=deadline_epoch_s,
            term_signal=term_signal,
            term_child_only=term_child_only,
            output=output,
        )
    pid, pidfd, ours = started
    return ShimProcess(
        pid=pid,
        attempt_dir=attempt_dir,
        # Our child's pid cannot be reused before we reap it, so opening it now cannot race;
        # a zygote's child comes with the pidfd the zygote opened before it could reap it.
        pidfd=_pidfd_open(pid) if ours else pidfd,
        is_child=ours,  # else watched by pidfd and lock, as an adopted shim
        deadline_at=deadline_epoch_s,
        grace_s=grace_s,
    )


def _make_dir(attempt_dir: Path) -> bool:
    """Create the attempt directory; whether it is new (one mkdir in the common case)."""
    try:
        attempt_dir.mkdir(mode=0o700)
    except FileNotFoundError:
        attempt_dir.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return False
    return True


def _claim(
    attempt_dir: Path, real: str, fresh: bool, output: Output, fds: list[int]
) -> tuple[list[int], Path | None]:
    """Lock the attempt directory and open what the shim gets (appended to `fds`): its
    descriptors for 1, 2, 3 (and 4, the secrets), and the attempt's cgroup if it has one."""
    lock_fd = _open_high(attempt_dir, os.O_RDONLY | os.O_DIRECTORY)
    fds.append(lock_fd)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise WorkerError(f"attempt dir already in use: {attempt_dir}") from None
    # No shim lives here (we hold the lock), so files left by an earlier one are stale; drop
    # them so that result.json and shim.pid always belong to the shim we start now.
    for name in (RESULT, SHIM_PID, CHILD_PID, CGROUP) if not fresh else ():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(attempt_dir / name)
    cgroup = _new_cgroup(attempt_dir, real)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    for name in (STDOUT, STDERR):
        fds.append(_open_high(attempt_dir / name, flags))
    child_fds = [fds[1], fds[2], lock_fd]
    if output.secrets:
        fds.append(_secrets_memfd(output.secrets))
        child_fds.append(fds[-1])
    return child_fds, cgroup


def _start(
    exe: str, args: list[str], env: Mapping[str, str], fds: list[int], via: Zygote | None
) -> tuple[int, int | None, bool] | None:
    """The shim's pid, the zygote's pidfd of it, and whether it is our child (exec'd here);
    None when the zygote went away after the request left."""
    if via is not None:
        try:
            forked = via.spawn(args, env, fds)
        except ZygoteLost:
            return None
        if forked is not None:
            return (*forked, False)
    # Every parent fd is O_CLOEXEC; dup2 clears the flag on the targets, so exactly 0-3 leak
    # (and 4, the secrets, when there are any).
    actions: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
    actions += [(os.POSIX_SPAWN_DUP2, fd, i + 1) for i, fd in enumerate(fds)]
    mask = _SHIM_SIGMASK
    pid = os.posix_spawn(exe, args, env, file_actions=actions, setsid=True, setsigmask=mask)
    return pid, None, True


def _after_lost_request(
    attempt_dir: Path, deadline_epoch_s: float | None, grace_s: float
) -> ShimProcess | None:
    """The zygote went away after a request left (we hold no copy of the lock any more): a
    shim it forked holds the lock or has left its pid behind; None when none was started. A
    shim forked on a machine too loaded to answer in time may take as long to write its pid:
    it is waited for longer than after a restart."""
    found = probe(attempt_dir, pid_wait_s=_LOST_REQUEST_PID_WAIT_S)
    if found.state == ProbeState.NOT_STARTED:
        return None
    proc = found.process
    if proc is None:  # it ended already (its result, or none: lost), nobody to wait for
        proc = ShimProcess(
            pid=_read_pid(attempt_dir / SHIM_PID) or 0,
            attempt_dir=attempt_dir,
            pidfd=None,
            is_child=False,
        )
    proc.deadline_at, proc.grace_s = deadline_epoch_s, grace_s
    return proc


def _shim_options(
    *,
    grace_s: float,
    term_signal: int,
    term_child_only: bool,
    cwd: str | None,
    deadline_epoch_s: float | None,
    output: Output,
) -> list[str]:
    args = [
        "--grace-ms",
        str(max(0, round(grace_s * 1000))),
        "--term-signal",
        str(int(term_signal)),
    ]
    if term_child_only:  # the child passes the stop on its own way (the agent runner)
        args += ["--term-child-only", "1"]
    if cwd is not None:
        args += ["--cwd", cwd]
    if deadline_epoch_s is not None:
        args += ["--deadline-ms", str(max(1, round(deadline_epoch_s * 1000)))]
    args += ["--umask", str(privacy.job_umask())]  # decimal, as every number the shim takes
    for word in output.pump_argv():
        args += ["--pump-arg", word]
    if output.secrets:
        args += ["--secrets-fd", str(SECRETS_FD)]
    return args


def _secrets_memfd(secrets: Sequence[str]) -> int:
    """The secret values, NUL-separated (no value can hold a NUL), in an anonymous memory file
    at fd >= 5: the shim hands it to its pump, and it is gone with them. Nothing of it is ever
    written to disk."""
    fd = os.memfd_create("corral-secrets", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"\0".join(s.encode("utf-8", "surrogateescape") for s in secrets))
        os.lseek(fd, 0, os.SEEK_SET)
        if fd >= 5:
            return fd
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    finally:
        if fd < 5:
            os.close(fd)


# --------------------------------------------------------------------------- recovery


class ProbeState(StrEnum):
    RUNNING = "running"  # lock held: the shim is alive (`process` is an adopted handle)
    FINISHED = "finished"  # lock free and result.json present (`result`)
    VANISHED = "vanished"  # lock free, shim.pid present, no result: the shim was killed
    NOT_STARTED = "not_started"  # nothing was ever started for this attempt


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    state: ProbeState
    process: ShimProcess | None = None
    result: ShimResult | None = None


def _lock_held(lock_path: Path) -> bool:
    """Whether someone holds the flock on the attempt directory, tested on a fresh open file
    description."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing also releases the lock if we got it
    return False


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise WorkerError(f"malformed {path}: {text!r}") from exc


def _adopt(attempt_dir: Path, pid: int) -> ShimProcess | None:
    """A handle on shim `pid` if it is alive and still holds the attempt lock, else None."""
    try:
        pidfd = _pidfd_open(pid)
    except ProcessLookupError:
        return None
    # Lock still held after pidfd_open ⇒ the pidfd is the live shim's, not a reused pid's.
    if _lock_held(attempt_dir):
        return ShimProcess(pid=pid, attempt_dir=attempt_dir, pidfd=pidfd, is_child=False)
    if pidfd is not None:
        os.close(pidfd)
    return None


def probe(attempt_dir: Path, *, pid_wait_s: float = _PROBE_PID_WAIT_S) -> ProbeResult:
    """Find out, from the directory alone, what became of an attempt's shim (after a restart):
    a held lock with no `shim.pid` yet is looked at again for up to `pid_wait_s`."""
    lock_path = attempt_dir
    give_up = time.monotonic() + pid_wait_s
    while True:
        if not lock_path.is_dir():
            return ProbeResult(state=ProbeState.NOT_STARTED)
        if not _lock_held(lock_path):
            result = read_result(attempt_dir)
            if result is not None:
                _drop_cgroup(attempt_dir)  # it ended while nobody watched: tidy up after it
                return ProbeResult(state=ProbeState.FINISHED, result=result)
            if (attempt_dir / SHIM_PID).exists():
                return ProbeResult(state=ProbeState.VANISHED)
            # a core that died between the attempt's cgroup and its shim left the cgroup empty
            _drop_cgroup(attempt_dir)
            return ProbeResult(state=ProbeState.NOT_STARTED)
        pid = _read_pid(attempt_dir / SHIM_PID)
        if pid is not None and (proc := _adopt(attempt_dir, pid)) is not None:
            return ProbeResult(state=ProbeState.RUNNING, process=proc)
        # Held, but the shim has not written shim.pid yet, or it exited just now: look again.
        if time.monotonic() >= give_up:
            raise WorkerError(f"{lock_path} is held but no live shim wrote {SHIM_PID}")
        time.sleep(0.01)


# --------------------------------------------------------------------------- without the shim


def _real(attempt_dir: Path) -> str:
    """The attempt directory's real path: its parent's (the attempts root, resolved once per
    process: a path resolved is a lstat per component, twice per spawn) and its own name."""
    parent = os.fspath(attempt_dir.parent)
    if not os.path.isabs(parent):  # relative to a working directory that may change
        return os.path.realpath(attempt_dir)
    return os.path.join(_real_dir(parent), attempt_dir.name)


@functools.lru_cache(maxsize=16)
def _real_dir(path: str) -> str:
    return os.path.realpath(path)


def _marker(attempt_dir: Path) -> bytes:
    return os.fsencode(f"{ATTEMPT_ENV}={_real(attempt_dir)}")


def attempt_processes(attempt_dir: Path) -> list[int]:
    """Every live process of the attempt, wherever it moved: in its cgroup, or carrying its
    marker (`CORRAL_ATTEMPT_DIR`): its job, the output pump, `setsid` and double-fork escapees,
    and an exec'd shim (a shim forked by the zygote shows the zygote's empty environment)."""
    found = set(proctab.marked(_marker(attempt_dir)))
    found.update(p for p in _cgroup_pids(attempt_dir) if proctab.alive(p))
    return sorted(found)


def sweep(attempt_dir: Path) -> int:
    """SIGKILL every process of the attempt (its cgroup, its marker) until none is left, and
    remove its cgroup. Bounded, like the shim's own kill: a process stuck in the kernel dies
    when it wakes. Returns how many were killed."""
    entry = _marker(attempt_dir)
    cgroup = _cgroup_of(attempt_dir)
    killed: set[int] = set()
    give_up = time.monotonic() + _SWEEP_GIVE_UP_S
    while True:
        in_cgroup = [p for p in _cgroup_pids(attempt_dir) if proctab.alive(p)]
        if in_cgroup and cgroup is not None:
            killed.update(in_cgroup)
            _kill_cgroup(cgroup, in_cgroup)
        pids = proctab.marked(entry)
        for pid in pids:
            if _kill_marked(pid, entry):
                killed.add(pid)
        if (not pids and not in_cgroup) or time.monotonic() >= give_up:
            break
        time.sleep(0.005)
    _drop_cgroup(attempt_dir)
    return len(killed)


# --------------------------------------------------------------------------- cgroups

_CGROUP_OFF = "off"  # CORRAL_CGROUP=off: markers only
_cgroup_lock = threading.Lock()
_cgroup_base: list[Path | None] = []  # [] not looked yet; [None] none usable


def cgroup_base() -> Path | None:
    """Where attempts' cgroups go: `corral/` under this process's own cgroup v2, if it can be
    made (root, or a delegated subtree); None otherwise (or with CORRAL_CGROUP=off)."""
    with _cgroup_lock:
        if not _cgroup_base:
            _cgroup_base.append(_find_cgroup_base())
        return _cgroup_base[0]


def _find_cgroup_base() -> Path | None:
    if os.environ.get("CORRAL_CGROUP", "").lower() == _CGROUP_OFF:
        return None
    own = proctab.cgroup2("self")
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    mount = next(
        (line.split()[4] for line in mounts if " - cgroup2 " in line and len(line.split()) > 4),
        None,
    )
    if mount is None or own is None:
        return None
    base = Path(mount) / own.lstrip("/") / "corral"
    try:
        base.mkdir(exist_ok=True)
    except OSError:
        return None
    return base if (base / "cgroup.procs").exists() else None


def _new_cgroup(attempt_dir: Path, real: str) -> Path | None:
    """A fresh cgroup for the attempt (`real`: its directory's real path), its path recorded in
    `<dir>/cgroup`; None without one."""
    base = cgroup_base()
    if base is None:
        return None
    name = f"{attempt_dir.name}-{hashlib.sha256(real.encode()).hexdigest()[:8]}"
    cgroup = base / name
    try:
        cgroup.mkdir(exist_ok=True)
        fd = os.open(
            attempt_dir / CGROUP, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, os.fsencode(str(cgroup)))
        finally:
            os.close(fd)
    except OSError:
        return None
    return cgroup


def _cgroup_of(attempt_dir: Path) -> Path | None:
    try:
        text = (attempt_dir / CGROUP).read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def _cgroup_pids(attempt_dir: Path) -> list[int]:
    cgroup = _cgroup_of(attempt_dir)
    if cgroup is None:
        return []
    try:
        return [int(w) for w in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_cgroup(cgroup: Path, pids: list[int]) -> None:
    """SIGKILL everything in the cgroup: one write to cgroup.kill (Linux 5.14+), else each pid
    (a pid the cgroup lists is its member until it is reaped: no reuse to fear)."""
    try:
        (cgroup / "cgroup.kill").write_text("1")
        return
    except OSError:
        pass
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _drop_cgroup(attempt_dir: Path) -> bool:
    """Remove the attempt's cgroup; False while processes are still in it."""
    cgroup = _cgroup_of(attempt_dir)
    if cgroup is None:
        return True
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return not _cgroup_pids(attempt_dir)  # busy, or not ours to remove: empty is enough
    return True


def _kill_marked(pid: int, entry: bytes) -> bool:
    """SIGKILL `pid` if it still is the marked process: the pidfd pins it, so the check and the
    kill cannot land on a newcomer that reused the pid."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not proctab.environ_has(pid, entry):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
