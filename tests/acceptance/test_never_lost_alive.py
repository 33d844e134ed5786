"""An attempt is never declared LOST (and retried) while something of it still runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.acceptance.invariants import invariants, runs_of, tracked
from tests.helpers import eventually


def test_an_attempt_whose_shim_died_with_the_engine_is_stopped_before_it_is_retried(
    corral: Corral, tmp_path: Path
) -> None:
    runs, first, overlap = tmp_path / "runs", tmp_path / "first.pid", tmp_path / "overlap"
    # Attempt 1 records its pid and runs on; attempt 2 notes whether attempt 1 still runs
    # (state in /proc, not `kill -0`: a zombie nobody reaped has ended).
    body = (
        f'if [ -e {first} ]; then s=$(cut -d" " -f3 /proc/$(cat {first})/stat 2>/dev/null);'
        f' if [ -n "$s" ] && [ "$s" != Z ]; then touch {overlap}; fi; exit 0; fi;'
        f" echo $$ > {first}; sleep 120"
    )
    job_id = corral.submit(*tracked(runs, body))
    engine = corral.serve()
    assert corral.wait(job_id, until="running") == 0
    eventually(lambda: first.exists() and first.read_text().strip(), what="attempt 1 running")
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    attempt_dir = Path(corral.job(job_id)["attempts"][0]["log_dir"])
    shim = int((attempt_dir / "shim.pid").read_text())
    child = int(first.read_text())
    os.kill(shim, signal.SIGKILL)  # the supervisor dies while nobody watches; the job runs on
    eventually(lambda: not alive(shim), what="the shim gone")
    assert alive(child)

    corral.drain()
    job = corral.job(job_id)
    assert job["state"] == "SUCCEEDED", corral.engine_log()
    assert [a["state"] for a in job["attempts"]] == ["LOST", "SUCCEEDED"]
    assert "stopped by the engine" in job["attempts"][0]["error"]
    assert not overlap.exists(), "attempt 2 started while attempt 1 still ran"
    assert not alive(child)
    assert [(j, a) for j, a, _ in runs_of(runs)] == [(job_id, 1), (job_id, 2)]
    corral.serve()
    invariants(corral, runs)
