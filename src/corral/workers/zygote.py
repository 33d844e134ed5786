"""The shims' zygote: one `corral-shim --zygote` per core, which forks a shim for each attempt
instead of the core exec'ing one (shim.c, "zygote", has the protocol).

A shim started by exec costs a fresh process image and the dynamic loader on top of the job's
own exec: about as much CPU as the job's exec itself (bench/README.md, "The shims' zygote").
A forked one runs the same supervision code from the zygote's image, so every guarantee of the
shim holds unchanged; the zygote only forks and reaps.

Faults: the zygote holds nothing of a running attempt. When it dies, its shims run on
(reparented) and the core, which watches them by pidfd and lock like any adopted shim, sees no
difference; the next spawn starts a new zygote. When it stops answering (SIGSTOP, a machine so
loaded it is not scheduled), a request waits at most `REPLY_S`; the zygote is then killed, and
whether the request was carried out is read off the attempt directory (`process.spawn`). When
no zygote can be started, shims are exec'd as before.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import signal
import socket
import struct
import threading
import time
import weakref
from collections.abc import Mapping, Sequence

from corral.domain.errors import WorkerError
from corral.workers import native

__all__ = ["REPLY_S", "Zygote", "ZygoteLost"]

log = logging.getLogger("corral.worker")

REPLY_S = 2.0  # how long a request may wait for the zygote's answer (a fork takes ~0.2 ms)
RETRY_S = 30.0  # after a zygote failed to start, shims are exec'd this long before trying again
# A request is one datagram; a bigger command line and environment than this is exec'd
# directly (the socket's buffer, which an unprivileged process cannot raise far, bounds it).
MAX_REQUEST = 192 * 1024
_REPLY = struct.Struct("ii")  # pid (< 0: the fork failed), errno


class ZygoteLost(WorkerError):
    """The zygote went away (or stopped answering) after a request left: whether it forked the
    shim is unknown, and must be read off the attempt directory."""


def _encode(argv: Sequence[str], env: Mapping[str, str]) -> bytes | None:
    """The request's body, or None when the zygote cannot carry it (exec'd directly instead,
    which refuses the same values the same way): a NUL in a string, an `=` in a variable's
    name, or a request over MAX_REQUEST."""
    words = [os.fsencode(a) for a in argv]
    for key, value in env.items():
        k = os.fsencode(key)
        if not k or b"=" in k:
            return None
        words.append(k + b"=" + os.fsencode(value))
    if any(b"\0" in w for w in words):
        return None
    body = struct.pack("II", len(argv), len(env)) + b"\0".join(words) + b"\0"
    return body if len(body) <= MAX_REQUEST else None


def _shut(sock: socket.socket, pid: int, kill: bool) -> None:
    """Close the zygote's socket (it exits at the EOF) and reap it; SIGKILL first if `kill`."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # our child, not reaped yet: the pid is still its own
    sock.close()
    give_up = time.monotonic() + 2.0
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() >= give_up:
            if not done:  # it does not exit at the EOF (stopped?): it must not linger
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            return
        time.sleep(0.001)


class Zygote:
    """A core's zygote, started at the first spawn; `spawn` asks it for one shim."""

    def __init__(self, *, reply_s: float = REPLY_S) -> None:
        self.reply_s = reply_s
        self._sock: socket.socket | None = None
        self._pid = 0
        self._finalize: weakref.finalize[..., Zygote] | None = None
        self._down_until = 0.0  # monotonic: no zygote could be started; exec shims till then
        self._turn = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The running zygote's pid (None: none runs now)."""
        return self._pid if self._sock is not None else None

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], fds: Sequence[int]
    ) -> tuple[int, int | None] | None:
        """Have the zygote fork a shim running `argv` (the shim's own command line) with `env`
        and `fds` at 1, 2, 3 (and 4): its pid and a pidfd of it (opened by the zygote before
        it could reap the shim, so it names that process even once the shim has ended), or
        None when the zygote cannot take the request (the caller execs the shim itself).
        Raises OSError when the fork failed, ZygoteLost when the zygote went away after the
        request left."""
        body = _encode(argv, env)
        if body is None:
            return None
        with self._turn:  # one request at a time: each answer is the request's before it
            return self._ask(body, fds)

    def _ask(self, body: bytes, fds: Sequence[int]) -> tuple[int, int | None] | None:
        sock = self._sent(body, fds)
        if sock is None:
            return None
        try:
            reply, ancillary, _flags, _ = sock.recvmsg(
                _REPLY.size, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
            )
        except OSError as err:  # socket.timeout included
            self._stop(kill=True, why=f"no answer ({err or 'timed out'})")
            raise ZygoteLost("the shims' zygote did not answer a request") from err
        pidfds = [
            fd
            for level, kind, data in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
            for fd in array.array("i", data[: len(data) - len(data) % 4])
        ]
        if len(reply) != _REPLY.size:
            for fd in pidfds:
                os.close(fd)
            self._stop(kill=True, why="it closed its socket")
            raise ZygoteLost("the shims' zygote went away during a request")
        pid, code = _REPLY.unpack(reply)
        for fd in pidfds[1:]:
            os.close(fd)
        if pid < 0:
            raise OSError(code, os.strerror(code))
        return pid, pidfds[0] if pidfds else None

    def _sent(self, body: bytes, fds: Sequence[int]) -> socket.socket | None:
        """Send the request to a live zygote (a dead one is replaced, once); its socket, or
        None when the request did not leave (nothing was forked)."""
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        for _ in range(2):
            sock = self._running()
            if sock is None:
                return None
            try:
                sock.sendmsg([body], rights)
                return sock
            except OSError as err:
                if err.errno == errno.EMSGSIZE:  # too big for the socket: exec'd instead
                    return None
                self._stop(kill=True, why=f"cannot reach it ({err})")
        return None

    def close(self) -> None:
        """Stop the zygote (the shims it started run on)."""
        with self._turn:
            self._stop(kill=False, why=None)

    def _running(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        if time.monotonic() < self._down_until:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            exe = str(native.shim_path())
            with contextlib.suppress(OSError):  # best effort: a request must fit in it
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_REQUEST * 2)
            pid = os.posix_spawn(
                exe,
                [exe, "--zygote", "3"],
                {},  # nothing of the core's environment: each request brings the shim's own
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
                ],
                setsid=True,  # out of the engine's terminal: a Ctrl-C is the engine's to handle
            )
        except (OSError, WorkerError) as err:  # WorkerError: the shim cannot be built
            ours.close()
            self._down_until = time.monotonic() + RETRY_S
            log.warning("cannot start the shims' zygote (%s): shims are exec'd", err)
            return None
        finally:
            theirs.close()
        ours.settimeout(self.reply_s)
        self._sock, self._pid = ours, pid
        self._finalize = weakref.finalize(self, _shut, ours, pid, False)
        return ours

    def _stop(self, *, kill: bool, why: str | None) -> None:
        if self._sock is None:
            return
        if why is not None:
            log.warning(
                "the shims' zygote %d: %s; a new one starts with the next attempt", self._pid, why
            )
        assert self._finalize is not None
        self._finalize.detach()
        _shut(self._sock, self._pid, kill)
        self._sock, self._finalize = None, None
