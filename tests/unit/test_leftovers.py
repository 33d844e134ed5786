"""The processes of an attempt whose shim is gone are found by their environment and stopped."""

from __future__ import annotations

import os
import subprocess

from corral.workers import proctab
from corral.workers.process import stop_leftovers


def test_the_attempts_processes_are_found_by_their_marker_and_stopped() -> None:
    env = {**os.environ, "CORRAL_JOB_ID": "job-leftover-test", "CORRAL_ATTEMPT": "2"}
    other = {**env, "CORRAL_ATTEMPT": "3"}
    mine = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    theirs = subprocess.Popen(["sleep", "60"], env=other, start_new_session=True)
    try:
        marker = {"CORRAL_JOB_ID": "job-leftover-test", "CORRAL_ATTEMPT": "2"}
        assert proctab.carrying(marker) == [mine.pid]
        assert stop_leftovers("job-leftover-test", 2) == [mine.pid]
        assert mine.wait(timeout=10) == -9
        assert proctab.carrying(marker) == []
        assert theirs.poll() is None, "another attempt's process is left alone"
        assert stop_leftovers("job-leftover-test", 2) == []
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()
