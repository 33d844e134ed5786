"""Retention through the real `corral` command: `corral gc` (and its dry run), the engine's own
periodic run, the archive files and `corral audit verify` over them, and that nothing of a job
that has not ended is touched while retention runs beside a busy engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import CONFIG, Corral
from tests.acceptance.test_json_schemas import conforms
from tests.helpers import eventually

RETAIN_ALL_ENDED = CONFIG.replace(
    "environments:",
    """\
  gated:
    concurrency: 2
    requires_approval: true
  patient:
    concurrency: 2
    # full jitter draws the wait from [0, cap): a cap of ~30 years keeps the job waiting
    retry: {base_s: 1.0e9, cap_s: 1.0e9}
environments:""",
) + (
    """\
retention:
  keep_jobs: 0
  interval_s: 1
"""
)


def _gone(c: Corral, job: str) -> bool:
    return c.run("show", job).returncode != 0


def _reported(c: Corral, job: str) -> bool:
    return bool(c.json("report", job).get("id"))


def _attempt_dirs(c: Corral, job: str) -> list[Path]:
    return sorted((c.data / "attempts").glob(f"{job}.*"))


def _snapshot(c: Corral, job: str) -> dict[str, Any]:
    shown = c.json("show", job)
    return {
        "state": shown["state"],
        "attempts": [(a["index"], a["state"]) for a in shown["attempts"]],
        "timeline": [(e["kind"], e["at"]) for e in shown["timeline"]],
        "dirs": _attempt_dirs(c, job),
    }


@pytest.mark.slow
def test_nothing_of_a_job_that_has_not_ended_is_touched_while_gc_runs(tmp_path: Path) -> None:
    c = Corral(tmp_path, RETAIN_ALL_ENDED)
    running = ""
    try:
        c.serve()
        early = [c.submit("sh", "-c", f"echo early {i}") for i in range(3)]
        for job in early:
            assert c.wait(job) in (0, 4)  # 4: ended and already collected by the engine
        # jobs that have not ended, in each waiting state: running, queued behind it,
        # waiting to retry, awaiting approval
        running = c.submit("sleep", "600", opts=("--role", "serial"))
        assert c.wait(running, until="running") == 0
        queued = c.submit("true", opts=("--role", "serial"))
        retrying = c.submit("sh", "-c", "exit 3", opts=("--role", "patient"))
        eventually(lambda: c.job(retrying)["state"] == "RETRY_WAIT", what="a retry wait")
        approval = c.submit("true", opts=("--role", "gated"))
        assert c.job(approval)["state"] == "AWAITING_APPROVAL"
        live = {job: _snapshot(c, job) for job in (running, queued, retrying, approval)}
        assert live[running]["dirs"] and live[retrying]["dirs"]
        # ended after the live jobs began: their records follow those of jobs that stay
        late = c.submit("sh", "-c", "echo late")
        assert c.wait(late) == 0
        eventually(lambda: _reported(c, late), what="the late job's report")

        # the engine collects every second by itself
        eventually(lambda: all(_gone(c, job) for job in early), what="the engine to collect")
        assert not any(_attempt_dirs(c, job) for job in early)
        assert "retention:" in c.engine_log()  # it said what it removed
        # `corral gc` beside it takes turns with it (5: conflict, the engine was collecting)
        r = c.run("gc", "--json")
        assert r.returncode in (0, 5), r.stderr

        for job, before in live.items():
            assert _snapshot(c, job) == before, job
        assert not _gone(c, late)
        out = json.loads(c.ok("gc", "--dry-run", "--json"))
        assert late in out["job_ids"] or out["held"] >= 1
        assert late not in out["job_ids"]  # held: it must wait for the live jobs
        assert c.ok("logs", running) == ""  # its log is still there (sleep prints nothing)
        audit = c.json("audit", "verify")
        assert audit["ok"], audit["problems"]
        assert audit["archived"] > 0 and audit["archives_missing"] == 0
        assert list((c.data / "archive").glob("corral-archive-*.jsonl"))
    finally:
        if running:
            c.run("cancel", running)
        c.stop_all()


@pytest.mark.slow
def test_gc_dry_run_then_archive_and_verify_round_trip(tmp_path: Path) -> None:
    config = RETAIN_ALL_ENDED.replace("interval_s: 1", "interval_s: 0")
    c = Corral(tmp_path, config)
    try:
        jobs = [c.submit("sh", "-c", f"echo job {i}") for i in range(4)]
        c.drain()
        c.serve()  # the reporter writes each ended job's run report
        for job in jobs:
            eventually(lambda job=job: _reported(c, job), what="a run report")
        c.stop_all()
        finished = _finished(c)
        assert finished == 4

        dry = conforms("GcReport", c.json("gc", "--dry-run"))  # its published schema
        assert sorted(dry["job_ids"]) == sorted(jobs) and dry["jobs"] == 4
        assert dry["archives"] == [] and not (c.data / "archive").exists()
        assert len(c.json("jobs")) == 4  # nothing changed
        assert all(_attempt_dirs(c, job) for job in jobs)

        done = conforms("GcReport", c.json("gc"))
        assert done["jobs"] == 4 and done["held"] == 0 and done["attempt_dirs"] == 4
        assert c.json("jobs") == []
        assert not any(_attempt_dirs(c, job) for job in jobs)
        assert _finished(c) == finished  # the counters keep what was removed
        [archive] = [Path(p) for p in done["archives"]]
        lines = [json.loads(line) for line in archive.read_text().splitlines()]
        assert lines[0]["archive"] == 1 and lines[0]["jobs"] == 4
        assert sorted(r["row"]["id"] for r in lines if r.get("table") == "jobs") == sorted(jobs)
        audit = c.json("audit", "verify")
        assert audit["ok"] and audit["archived"] == sum(done["records"].values())
        assert done["records"]["run_reports"] == 4  # each job's report went with it
        assert c.json("gc")["jobs"] == 0  # nothing left past retention

        # a record changed in the archive is found; a missing archive is said, not failed
        text = archive.read_text()
        changed = text.replace('"kind":"running"', '"kind":"queued"', 1)
        assert changed != text
        archive.write_text(changed)
        r = c.run("audit", "verify")
        assert r.returncode == 1 and "archive" in r.stderr, r.stderr
        archive.unlink()
        audit = c.json("audit", "verify")
        assert audit["ok"] and audit["archives_missing"] == 1
    finally:
        c.stop_all()


def _finished(c: Corral) -> float:
    total = 0.0
    for line in c.ok("metrics").splitlines():
        if line.startswith("corral_jobs_finished_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total
