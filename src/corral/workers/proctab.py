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
    return ProcStat(pid=pid, comm=comm, state=fields[0].decode(errors="replace"), ppid=ppid,
                    pgid=pgid, sid=sid)


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


def carrying(marker: dict[str, str]) -> list[int]:
    """Live processes whose environment holds every `NAME=value` of `marker` (the processes of
    one attempt carry its job id and attempt index, whatever session or parent they have now).
    A process whose environment we cannot read (gone, or not ours) does not match."""
    wanted = {f"{k}={v}".encode() for k, v in marker.items()}
    found = []
    for stat in live_processes():
        try:
            with open(f"/proc/{stat.pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= env:
            found.append(stat.pid)
    return sorted(found)
