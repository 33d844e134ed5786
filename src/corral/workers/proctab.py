"""The process table, read from /proc: one parser for every place that looks at processes.

Reading `/proc/<pid>/stat` races with the process's exit: the file may be gone (ENOENT, ESRCH),
or the read may return an empty or truncated line while the kernel tears the process down. Every
such case means "this process is not there (any more)", never an exception for the caller
(tests/unit/test_proctab.py feeds the parser empty, cut and odd lines).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GONE_STATES = frozenset({"Z", "X", "x"})  # zombie, dead: exited, only the table entry remains


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcStat:
    """The fields of `/proc/<pid>/stat` that process supervision needs."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int

    @property
    def live(self) -> bool:
        """Running or sleeping: not a zombie waiting to be reaped."""
        return self.state not in GONE_STATES


def parse_stat(pid: int, raw: bytes) -> ProcStat | None:
    """The stat line of `pid`, or None when it is empty, cut short or not a stat line at all."""
    # comm (field 2) may hold spaces and parentheses: the fixed fields follow the LAST ')'.
    open_at, close_at = raw.find(b"("), raw.rfind(b")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = raw[close_at + 1 :].split()
    if len(fields) < 4:
        return None
    try:
        ppid, pgid, sid = int(fields[1]), int(fields[2]), int(fields[3])
    except ValueError:
        return None
    comm = raw[open_at + 1 : close_at].decode(errors="replace")
    return ProcStat(
        pid=pid, comm=comm, state=fields[0].decode(errors="replace"), ppid=ppid, pgid=pgid, sid=sid
    )


def read_stat(pid: int) -> ProcStat | None:
    """The process `pid` as /proc shows it now, or None if it is gone (or going)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:  # ENOENT, ESRCH: gone; EACCES: hidden from us, which is the same to us
        return None
    return parse_stat(pid, raw)


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    stat = read_stat(pid)
    return stat is not None and stat.live


def live_processes() -> list[ProcStat]:
    """Every live process in the table at this moment."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None and stat.live:
                found.append(stat)
    return found


def descendants(pid: int) -> list[int]:
    """Live processes whose parent chain leads to `pid`, whatever session or group they moved to."""
    children: dict[int, list[int]] = {}
    for stat in live_processes():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return sorted(found)


def environ(pid: int) -> list[bytes]:
    """The `NAME=value` entries process `pid` was exec'd with (`/proc/<pid>/environ`).

    It is unreadable (or empty) for a process that is gone or going, hidden from us, or a
    kernel thread: all of these read as an empty environment, never as an exception."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether process `pid` started with `entry` (`NAME=value`) in its environment."""
    return entry in environ(pid)


def cgroup2(pid: int | str) -> str | None:
    """The cgroup v2 path of process `pid` (or "self"), as `/proc/<pid>/cgroup` gives it on its
    `0::` line; None when it is gone or the host has no cgroup v2."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return next((line[3:].strip() for line in lines if line.startswith("0::")), None)


def marked(entry: bytes) -> list[int]:
    """Live processes (not this one) whose environment holds `entry`, by pid.

    The marker survives what escapes a process tree walk: `setsid`, a double fork, a parent
    that died and left its children to init. Only a process that scrubs its environment
    before an exec loses it."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if (
            name.isdigit()
            and int(name) != me
            and environ_has(int(name), entry)
            and alive(int(name))
        ):
            found.append(int(name))
    return sorted(found)
