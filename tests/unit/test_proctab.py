"""The /proc reader: a process mid-exit is "gone", never an exception (issue: flaky tree test)."""

from __future__ import annotations

import os
import subprocess

import pytest

from corral.workers.proctab import ProcStat, alive, descendants, parse_stat, read_stat

LINE = b"4242 (x) (y z) S 17 4242 4242 0 -1 4194560 120 0 0 0 1 0 0 0 20 0 1 0 123 0 0"


def test_a_comm_with_spaces_and_parentheses_is_parsed_after_the_last_paren() -> None:
    assert parse_stat(4242, LINE) == ProcStat(
        pid=4242, comm="x) (y z", state="S", ppid=17, pgid=4242, sid=4242
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # read at the moment the process was torn down
        b"4242 (sleep",  # cut inside comm
        b"4242 (sleep) S 1",  # cut after the state: no pgid or sid yet
        b"4242 sleep S 1 2 3",  # no parentheses: not a stat line
        b"4242 (sleep) S one 2 3",  # a field that is not a number
        b"4242 )sleep( S 1 2 3",
    ],
)
def test_empty_cut_or_malformed_lines_mean_gone(raw: bytes) -> None:
    assert parse_stat(4242, raw) is None


@pytest.mark.parametrize(
    ("state", "live"),
    [("R", True), ("S", True), ("D", True), ("T", True), ("Z", False), ("X", False)],
)
def test_zombies_and_dead_entries_are_not_live(state: str, live: bool) -> None:
    raw = LINE.replace(b") S ", f") {state} ".encode())
    stat = parse_stat(4242, raw)
    assert stat is not None and stat.live is live


def test_this_process_and_a_reaped_child() -> None:
    me = read_stat(os.getpid())
    assert me is not None and me.live and me.ppid == os.getppid() and me.sid == os.getsid(0)
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert alive(child.pid) and child.pid in descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert not alive(child.pid) and read_stat(child.pid) is None
    assert child.pid not in descendants(os.getpid())
