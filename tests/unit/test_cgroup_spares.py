"""Attempts' cgroups are made ahead in a thread (workers/process.py `_SparePool`): a start takes
a spare instead of waiting for the kernel, spares of a process that is gone are removed, and a
spare that holds a process is never removed."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.workers import process


def _wait(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def base() -> Path:
    found = process.cgroup_base()
    if found is None:
        pytest.fail("this host gives attempts no cgroup (the tests run where it does)")
    return found


def test_a_start_takes_a_spare_made_ahead_and_the_rest_go_at_exit(base: Path) -> None:
    pool = process._SparePool()
    assert pool.take(base) is None  # none yet: the caller makes its own; the filling starts
    assert _wait(lambda: len(pool._spare) == process.SPARE_CGROUPS)
    spare = pool.take(base)
    assert spare is not None and spare.is_dir() and (spare / "cgroup.procs").exists()
    assert spare.name.startswith(f"spare-{os.getpid()}-")
    assert _wait(lambda: len(pool._spare) == process.SPARE_CGROUPS)  # topped up again
    left = list(pool._spare)
    pool.drop()
    assert not any(p.exists() for p in left) and spare.exists()  # a taken one is the attempt's
    spare.rmdir()


def test_new_cgroup_records_the_spare_it_took(base: Path, tmp_path: Path) -> None:
    attempt = tmp_path / "job.1"
    attempt.mkdir()
    first = process._new_cgroup(attempt)
    assert first is not None and (attempt / "cgroup").read_text() == str(first)
    assert _wait(lambda: len(process._spares._spare) > 0)
    second_dir = tmp_path / "job.2"
    second_dir.mkdir()
    second = process._new_cgroup(second_dir)
    assert second is not None and second.name.startswith("spare-")
    assert (second_dir / "cgroup").read_text() == str(second)
    for d in (attempt, second_dir):
        assert process._drop_cgroup(d)
    assert not first.exists() and not second.exists()


def test_spares_of_a_gone_process_are_removed_but_not_one_in_use(base: Path) -> None:
    gone = 2**22 - 7  # above pid_max's usual values: no such process
    assert not Path(f"/proc/{gone}").exists()
    empty = base / f"spare-{gone}-1"
    busy = base / f"spare-{gone}-2"
    empty.mkdir()
    busy.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        process._drop_stale_spares(base)
        assert not empty.exists()
        assert busy.exists(), "a cgroup with a process in it is never removed"
    finally:
        sleeper.kill()
        sleeper.wait()
        assert _wait(lambda: not (busy / "cgroup.procs").read_text().split())
        busy.rmdir()
