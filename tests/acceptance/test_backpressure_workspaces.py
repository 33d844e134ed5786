"""Backpressure and workspace locks through the real `corral` command and real processes.

A full queue makes `corral submit` exit 75 (EX_TEMPFAIL) with one line saying when to retry and
writes nothing. Jobs on one workspace (role policy `serialize`) never run at the same time: each
job's own process logs when it starts and ends, and the intervals must not overlap.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.acceptance.conftest import CONFIG, Corral

FULL_AT_2 = (
    CONFIG
    + """\
  gpu:
    max_inflight: 1
    max_queued: 1
"""
)


def test_a_full_queue_refuses_a_submission_with_exit_75(tmp_path: Path) -> None:
    corral = Corral(tmp_path, FULL_AT_2.replace("scheduler:\n", "scheduler:\n  max_queued: 2\n", 1))
    first = corral.submit("true", opts=("--key", "k"))
    corral.submit("true")
    refused = corral.run("submit", "--", "true")
    assert refused.returncode == 75
    assert refused.stdout == ""
    assert refused.stderr.count("\n") == 1  # one line
    assert refused.stderr == (
        "corral: error: queue full: 2 jobs queued (max 2, scheduler.max_queued); retry after 5 s\n"
    )
    assert len(corral.json("jobs")) == 2  # nothing written
    # a submission that coalesces into a queued job adds nothing, so it passes
    assert corral.submit("true", opts=("--key", "k")) == first
    # a per-environment bound
    corral.ok("cancel", first)
    corral.submit("true", opts=("--env", "gpu"))
    gpu = corral.run("submit", "--env", "gpu", "--", "true")
    assert gpu.returncode == 75
    assert "queue full: 1 jobs queued in environment gpu (max 1, " in gpu.stderr
    assert "retry after" in gpu.stderr


_SUBMIT = """
import sys, anyio
from corral.config import load
from corral.domain.models import JobSpec
from corral.runtime.assembly import build_store
from corral.services.submissions import submissions

async def main():
    log, workspace, control = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = load()
    store = build_store(cfg)
    await store.open()
    svc = submissions(store, cfg)
    def job(tag, ws, pause):
        script = (f'echo "{tag} start $(date +%s.%N)" >> {log}; sleep {pause}; '
                  f'echo "{tag} end $(date +%s.%N)" >> {log}')
        return JobSpec(command=("sh", "-c", script), workspace=ws)
    for tag, ws, pause in (("a", workspace, 0.5), ("b", workspace, 0.5),
                           ("c1", control, 1), ("c2", None, 1)):
        print((await svc.submit(job(tag, ws, pause))).job.id)
    await store.close()

anyio.run(main)
"""


def _intervals(log: Path) -> dict[str, tuple[float, float]]:
    marks: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        tag, what, at = line.split()
        marks.setdefault(tag, {})[what] = float(at)
    return {tag: (m["start"], m["end"]) for tag, m in marks.items()}


def test_serialized_jobs_on_one_workspace_never_overlap(corral: Corral, tmp_path: Path) -> None:
    log = tmp_path / "intervals.log"
    workspace = tmp_path / "repo"
    workspace.mkdir()
    submitted = subprocess.run(
        [sys.executable, "-c", _SUBMIT, str(log), str(workspace), str(tmp_path / "other")],
        env=corral.env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=corral.work,
    )
    assert submitted.returncode == 0, submitted.stderr
    a, b, c1, c2 = submitted.stdout.split()
    corral.drain()
    for job_id in (a, b, c1, c2):
        assert corral.job(job_id)["state"] == "SUCCEEDED"
    spans = _intervals(log)
    # one at a time, in queue order (a was queued first)
    assert spans["a"][1] <= spans["b"][0], f"jobs on one workspace overlapped: {spans}"
    # the engine ran other work alongside: the lock serialises one workspace, not the queue
    starts, ends = zip(*(spans[tag] for tag in ("a", "c1", "c2")), strict=True)
    assert max(starts) < min(ends), f"expected a, c1 and c2 to run together: {spans}"
    waited = [
        e["data"] for e in corral.job(b)["timeline"] if e["kind"] == "workspace_lock_acquired"
    ]
    assert len(waited) == 1 and waited[0]["workspace"] == str(workspace)
    assert waited[0]["wait_ms"] > 0
