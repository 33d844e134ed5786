"""Who is on the other end of one of the engine's unix sockets, and what it may ask.

The kernel says who connected (SO_PEERCRED: pid, uid, gid, taken when it connected). Only the
engine's own user may use its sockets, or a member of `engine.socket_group` when one is
configured; anyone else is refused with a logged line, whatever the file's modes let through.

An admitted caller is the *operator* unless it is one of the engine's jobs: a process in an
attempt's cgroup (where the host gives attempts one: the kernel keeps that membership whatever
the process does to its environment, session or parent), or whose environment, an ancestor's,
or its session leader's, names a job of this engine (`CORRAL_JOB_ID`, which every attempt
starts with). A job may do what a job does — ask whether
the engine is there, poke it after submitting children or a cancel of its own, read the core's
state — but not operator commands (reset a breaker, clear an escalation). It is looked for
(`identify`) only where the answer depends on it. See
docs/explanation/governance.md for what this protects against and what it does not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
from anyio.abc import SocketStream

from corral.workers import proctab

log = logging.getLogger("corral.sockets")

JOB_ENV = b"CORRAL_JOB_ID"
MAX_ANCESTORS = 64  # a process tree deeper than this is walked no further
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

Capability = Literal["operator", "job"]
IsJob = Callable[[str], Awaitable[bool]]  # is this id one of this engine's jobs?


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int
    capability: Capability = "operator"
    job: str | None = None  # the job it belongs to, when it is a job's process

    def describe(self) -> str:
        who = f"pid {self.pid}, uid {self.uid}"
        return f"{who}, job {self.job}" if self.job else who


class Refused(Exception):
    """The peer may not use this socket: the message says why, in one line."""


def credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected to `sock`."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return pid, uid, gid


def check_user(pid: int, uid: int, gid: int, *, group: int | None) -> None:
    """Refused unless the peer is the engine's user or a member of the socket group."""
    if uid == os.geteuid():
        return
    if group is not None and (gid == group or group in _groups(pid)):
        return
    allowed = f"uid {os.geteuid()}" + (f" or group {group}" if group is not None else "")
    raise Refused(f"pid {pid} runs as uid {uid}: only {allowed} may use this socket")


def admit(sock: socket.socket, *, group: int | None, what: str) -> Peer:
    """The peer of a new connection if it may use the socket at all (its user); Refused
    (logged) for a stranger. Whether it is one of the engine's jobs is `identify`'s to say."""
    try:
        pid, uid, gid = credentials(sock)
    except OSError as err:
        log.warning("%s: refused a connection: cannot read its credentials (%s)", what, err)
        raise Refused(f"cannot read the caller's credentials ({err})") from None
    try:
        check_user(pid, uid, gid, group=group)
    except Refused as err:
        log.warning("%s: refused: %s", what, err)
        raise
    return Peer(pid, uid, gid)


async def identify(peer: Peer, is_job: IsJob) -> Peer:
    """`peer` with its capability: a job's when a mark on it names one of the engine's jobs.
    A caller gone before it could be looked at is Refused, not taken for the operator: its
    marks went with it."""
    marks = job_marks(peer.pid)
    for job in marks:
        if await is_job(job):
            return Peer(peer.pid, peer.uid, peer.gid, "job", job)
    if not marks and proctab.read_stat(peer.pid) is None:
        raise Refused(f"pid {peer.pid} exited before it could be identified")
    return peer


def job_marks(pid: int) -> list[str]:
    """The job ids `pid` may belong to, surest first: the job of the attempt cgroup it is in,
    then those named by its environment, its ancestors' up to (not including) this process,
    and its session leader's."""
    found: list[str] = []
    in_cgroup = cgroup_job(pid)
    if in_cgroup:
        found.append(in_cgroup)
    me = os.getpid()
    seen: set[int] = set()
    current = pid
    for _ in range(MAX_ANCESTORS):
        if current <= 1 or current == me or current in seen:
            break
        seen.add(current)
        _mark(current, found)
        stat = proctab.read_stat(current)
        current = stat.ppid if stat else 0
    stat = proctab.read_stat(pid)
    session = stat.sid if stat else 0
    if session > 1 and session not in seen and session != me:
        _mark(session, found)
    return found


def cgroup_job(pid: int) -> str | None:
    """The job whose attempt cgroup holds `pid`: `…/corral/<job id>.<attempt>-<hash>`
    (workers/process.py); None outside one, or where attempts get no cgroup."""
    path = proctab.cgroup2(pid)
    parts = path.split("/") if path else []
    if "corral" not in parts[:-1]:
        return None
    attempt = parts[len(parts) - parts[::-1].index("corral")]
    return attempt.rpartition("-")[0].rpartition(".")[0] or None


def _mark(pid: int, found: list[str]) -> None:
    for entry in proctab.environ(pid):
        name, _, value = entry.partition(b"=")
        if name == JOB_ENV and value:
            job = value.decode(errors="replace")
            if job not in found:
                found.append(job)


def _groups(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("Groups:"):
            return {int(g) for g in line.split()[1:] if g.isdigit()}
    return set()


async def refuse(stream: SocketStream, answer: bytes) -> None:
    """Answer a refused caller: read what it sent first (a little, briefly), since closing a
    unix socket with unread data resets it before the caller reads the answer."""
    with anyio.move_on_after(1.0):
        data = b""
        while b"\n" not in data and len(data) < 65536:
            try:
                data += await stream.receive(4096)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(answer)


def restrict(path: Path, group: int | None) -> None:
    """A socket file only its user (and the socket group) can connect to."""
    if group is None:
        os.chmod(path, 0o600)
        return
    os.chown(path, -1, group)
    os.chmod(path, 0o660)
