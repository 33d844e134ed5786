"""SIGKILL the engine with attempts in flight: nothing lost, nothing run twice, no orphans."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.helpers import eventually


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_engine_sigkill_keeps_agents_running_and_recovers_exactly_once(
    corral: Corral, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    started = tmp_path / "started"
    script = f'echo "$CORRAL_JOB_ID $$" >> {started}; sleep 1.5; echo "$CORRAL_JOB_ID" >> {runs}'
    ids = [corral.submit("sh", "-c", script) for _ in range(6)]
    engine = corral.serve()
    eventually(lambda: len(_lines(started)) >= 8, what="four attempts running")
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    running = {int(pid) for pid in _lines(started)[1::2]}
    assert running and all(alive(p) for p in running), "agents must outlive the engine"

    corral.drain()
    assert [corral.job(i)["state"] for i in ids] == ["SUCCEEDED"] * 6
    finished = _lines(runs)
    assert sorted(finished) == sorted(ids), "every job ran to completion exactly once"
    assert all(len(corral.job(i)["attempts"]) == 1 for i in ids), "no attempt started twice"
    recovered = [e for i in ids for e in corral.job(i)["timeline"] if e["kind"] == "recovered"]
    assert len(recovered) == len(running)
    assert not any(alive(p) for p in running)


def test_a_process_that_died_during_the_outage_is_lost_and_retried(
    corral: Corral, tmp_path: Path
) -> None:
    marker = tmp_path / "second-try"
    script = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; sleep 60"
    job_id = corral.submit("sh", "-c", script)
    engine = corral.serve()
    assert corral.wait(job_id, until="running") == 0
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    attempt_dir = Path(corral.job(job_id)["attempts"][0]["log_dir"])
    shim = int((attempt_dir / "shim.pid").read_text())
    child = int((attempt_dir / "child.pid").read_text())
    os.kill(shim, signal.SIGKILL)  # the whole attempt dies while nobody watches
    os.kill(child, signal.SIGKILL)
    eventually(lambda: not alive(shim) and not alive(child), what="attempt gone")

    corral.drain()
    job = corral.job(job_id)
    assert job["state"] == "SUCCEEDED"
    assert [a["state"] for a in job["attempts"]] == ["LOST", "SUCCEEDED"]
    assert "vanished" in job["attempts"][0]["error"]


def test_a_job_that_finished_during_the_outage_is_collected(corral: Corral) -> None:
    go = corral.work / "go"  # the job ends only once the engine is down
    job_id = corral.submit(
        "sh",
        "-c",
        f"while [ ! -e {go} ]; do sleep 0.05; done; exit 7",
        opts=("--max-attempts", "1"),
    )
    engine = corral.serve()
    assert corral.wait(job_id, until="running") == 0
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    go.parent.mkdir(parents=True, exist_ok=True)
    go.touch()
    attempt_dir = Path(corral.job(job_id)["attempts"][0]["log_dir"])
    eventually(lambda: (attempt_dir / "result.json").exists(), what="the shim's result")
    corral.drain()
    job = corral.job(job_id)
    assert job["state"] == "DEAD_LETTERED" and job["exit_code"] == 7
    assert len(job["attempts"]) == 1 and job["attempts"][0]["exit_code"] == 7


def test_cancel_while_the_engine_is_down_is_applied_on_restart(corral: Corral) -> None:
    job_id = corral.submit("sleep", "60")
    engine = corral.serve()
    assert corral.wait(job_id, until="running") == 0
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    out = corral.ok("cancel", job_id)
    assert "no engine is running" in out
    corral.serve()
    assert corral.wait(job_id) == 130
    assert corral.job(job_id)["attempts"][0]["state"] == "CANCELLED"
