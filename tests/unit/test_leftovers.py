"""The processes of an attempt whose shim is gone are found by their marker and stopped before
the attempt is declared lost, and only they."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from corral.domain.states import Outcome
from corral.workers import proctab
from corral.workers.command import vanished
from corral.workers.process import ATTEMPT_ENV


def test_the_attempts_processes_are_found_by_their_marker_and_stopped(tmp_path: Path) -> None:
    mine_dir, other_dir = tmp_path / "job.2", tmp_path / "job.3"
    mine_dir.mkdir()
    other_dir.mkdir()
    mine = subprocess.Popen(
        ["sleep", "60"],
        start_new_session=True,
        env={**os.environ, ATTEMPT_ENV: str(mine_dir.resolve())},
    )
    theirs = subprocess.Popen(
        ["sleep", "60"],
        start_new_session=True,
        env={**os.environ, ATTEMPT_ENV: str(other_dir.resolve())},
    )
    try:
        result = vanished(mine_dir)
        assert result.outcome is Outcome.LOST
        assert result.error is not None and "1 process(es) of the attempt stopped" in result.error
        assert mine.wait(timeout=10) == -9
        assert not proctab.alive(mine.pid)
        assert theirs.poll() is None, "another attempt's process is left alone"
        assert vanished(mine_dir).error == "process vanished while the engine was down"
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()
