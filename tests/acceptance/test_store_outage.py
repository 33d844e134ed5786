"""The store goes away under a running engine: the engine rides the outage out.

A SQLite write lock held by another process longer than the busy timeout makes every write of
the engine fail; the engine keeps its attempts running, keeps answering, says it is degraded
(`corral status`, its log), and writes what it owes once the lock is gone.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.runtime.control import poke
from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.acceptance.invariants import invariants, runs_of, tracked
from tests.helpers import eventually

CONFIG = """\
scheduler: {poll_interval_s: 0.2}
store: {sqlite_busy_timeout_ms: 200}
roles:
  default: {concurrency: 4, retry: {base_s: 0.05, cap_s: 0.2}}
environments:
  local: {max_inflight: 8}
"""

# Holds SQLite's write lock (BEGIN IMMEDIATE) until its stdin closes.
_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def test_a_sqlite_lock_held_past_the_busy_timeout_is_ridden_out(tmp_path: Path) -> None:
    c = Corral(tmp_path, CONFIG)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    try:
        engine = c.serve()
        # Each job waits for the gate file, then ends: it ends while the lock is held.
        ids = [
            c.submit(*tracked(runs, f"while [ ! -e {gate} ]; do sleep 0.05; done"))
            for _ in range(3)
        ]
        eventually(lambda: len(runs_of(runs)) == 3, what="three attempts running")
        for i in ids:
            assert c.wait(i, until="running") == 0
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(c.data / "corral.db")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            gate.touch()  # the attempts end; writing their ends fails while the lock is held
            eventually(lambda: "store unavailable" in c.engine_log(), what="the outage logged")
            assert engine.poll() is None, c.engine_log()
            status = c.json("status")
            assert status["store"]["degraded"] is True and "locked" in status["store"]["error"]
            assert "store DEGRADED" in c.ok("status")
            assert poke(c.data, "ping"), "the engine keeps answering"
            assert {c.job(i)["state"] for i in ids} == {"RUNNING"}  # reads still work
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=10)
        for i in ids:
            assert c.wait(i) == 0, c.engine_log()
        assert engine.poll() is None
        log = c.engine_log()
        assert log.count("store unavailable") == 1, "one line per outage"
        # the line is written once the first write after the outage committed: a job's end
        # can be read before it reaches the log
        eventually(lambda: "store answers again" in c.engine_log(), what="the recovery logged")
        assert c.json("status")["store"]["degraded"] is False
        assert all(len(c.job(i)["attempts"]) == 1 for i in ids), "nothing ran twice"
        invariants(c, runs)
    finally:
        c.stop_all()


def _fill(path: Path) -> None:
    """Write `path` until the file system is full (ENOSPC)."""
    chunk = b"\0" * 65536
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
                break
    with path.open("ab", buffering=0) as f:  # and the last few bytes
        while True:
            try:
                f.write(b"\0" * 512)
            except OSError:
                return


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs, unmounted afterwards (the tests run as root, like the rest of the
    acceptance suite's process control)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"a full disk is simulated on a tmpfs mount: {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_under_the_store_is_ridden_out(tmp_path: Path, small_disk: Path) -> None:
    db = small_disk / "corral.db"
    c = Corral(
        tmp_path / "c",
        CONFIG.replace("store: {sqlite_busy_timeout_ms: 200}", f"store: {{url: 'sqlite://{db}'}}"),
    )
    runs, gate, filler = tmp_path / "runs", tmp_path / "gate", small_disk / "filler"
    try:
        engine = c.serve()
        ids = [
            c.submit(*tracked(runs, f"while [ ! -e {gate} ]; do sleep 0.05; done"))
            for _ in range(3)
        ]
        for i in ids:
            assert c.wait(i, until="running") == 0
        _fill(filler)
        # The heart-beat's write fails within one beat; the attempts go on.
        eventually(
            lambda: "store unavailable" in c.engine_log(), timeout=30, what="the outage logged"
        )
        assert engine.poll() is None, c.engine_log()
        status = c.json("status")
        assert status["store"]["degraded"] is True and "disk full" in status["store"]["error"]
        assert all(alive(pid) for _, _, pid in runs_of(runs)), "the attempts keep running"
        filler.unlink()
        gate.touch()
        for i in ids:
            assert c.wait(i) == 0, c.engine_log()
        eventually(lambda: c.json("status")["store"]["degraded"] is False, what="the outage over")
        log = c.engine_log()
        assert log.count("store unavailable") == 1 and "store answers again" in log
        assert all(len(c.job(i)["attempts"]) == 1 for i in ids), "nothing ran twice"
        invariants(c, runs)
    finally:
        c.stop_all()
