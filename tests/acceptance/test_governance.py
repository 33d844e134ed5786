"""Run reports, incidents, the unified read model and the audit chain, through the real engine
and the real `corral` command."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pytest

from tests.acceptance.conftest import Corral
from tests.helpers import eventually


def test_every_terminal_job_gets_one_report_and_its_incidents(corral: Corral) -> None:
    corral.serve()
    ok = corral.submit("true")
    flaky = corral.submit("sh", "-c", "exit 3", opts=("--max-attempts", "2"))
    queued = corral.submit("sleep", "30", opts=("--after", flaky))  # fails with its dependency
    for job in (ok, flaky):
        corral.wait(job)
    corral.wait(queued)

    def report(job: str) -> dict[str, object] | None:
        r = corral.run("report", job, "--json")
        data = corral.json("report", job) if r.returncode == 0 else None
        return data if data and data.get("id") else None

    reports = {
        job: eventually(lambda j=job: report(j), what=f"the report of {job}")
        for job in (ok, flaky, queued)
    }
    assert reports[ok]["outcome"] == "success" and reports[ok]["attempts"] == 1
    assert reports[flaky]["outcome"] == "dead_lettered" and reports[flaky]["attempts"] == 2
    assert reports[queued]["outcome"] == "failed"
    kinds = {i["type"] for i in reports[flaky]["incidents"]}
    assert "retry_exhausted" in kinds
    assert all(str(r["hash"]).startswith("k1:") for r in reports.values())  # keyed

    runs = {r["job_id"]: r for r in corral.json("runs")}
    assert runs[flaky]["outcome"] == "dead_lettered" and runs[flaky]["incidents_total"] >= 1
    assert corral.ok("audit", "verify").startswith("audit ok")


def test_a_cancel_is_reported_cancelled_never_killed(corral: Corral) -> None:
    corral.serve()
    job = corral.submit("sleep", "30")
    assert corral.wait(job, until="running") == 0
    corral.ok("cancel", job)
    corral.wait(job)
    data = eventually(
        lambda: corral.run("report", job).returncode == 0 and corral.json("report", job),
        what="the report",
    )
    assert data["outcome"] == "cancelled"
    assert not any(i["type"] == "kill_switch_activated" for i in data["incidents"])


def test_records_are_append_only_and_tampering_is_found(corral: Corral) -> None:
    corral.serve()
    job = corral.submit("true")
    corral.wait(job)
    eventually(lambda: corral.run("report", job).returncode == 0, what="the report")
    corral.stop_all()
    db = sqlite3.connect(corral.data / "corral.db")
    for sql in ("UPDATE run_reports SET summary = 'edited'", "DELETE FROM run_reports"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
    # Someone with the file drops the guard, edits a report and puts the guard back.
    [(name, guard)] = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'run_reports'"
        " AND sql LIKE '%UPDATE%'"
    ).fetchall()
    db.execute(f"DROP TRIGGER {name}")
    db.execute("UPDATE run_reports SET summary = 'all good, nothing to see'")
    db.execute(guard)
    db.commit()
    db.close()
    r = corral.run("audit", "verify")
    assert r.returncode == 1
    assert "run_reports" in r.stderr


def test_kill_switch_stops_running_attempts_within_a_second_and_denies_new_runs(
    corral: Corral,
) -> None:
    corral.serve()
    running = [corral.submit("sleep", "60", opts=("--tenant", "acme")) for _ in range(2)]
    other = corral.submit("sleep", "60", opts=("--tenant", "globex"))
    for job in (*running, other):
        assert corral.wait(job, until="running") == 0
    corral.ok("kill-switch", "on", "--scope", "tenant", "--target", "acme", "--reason", "leak")
    for job in running:
        corral.wait(job, timeout=10)
    [switch] = corral.json("kill-switch", "status")
    on_at = dt.datetime.fromisoformat(switch["created_at"])
    for job in running:
        info = corral.job(job)
        assert info["state"] == "KILLED"
        assert info["last_error"] == f"kill switch {switch['id']}: leak"  # not "cancelled"
        ended = dt.datetime.fromisoformat(info["attempts"][0]["ended"])
        assert (ended - on_at).total_seconds() < 1.0  # the bound: within a second
    assert corral.job(other)["state"] == "RUNNING"  # out of scope
    late = corral.submit("true", opts=("--tenant", "acme"))
    corral.wait(late, timeout=10)
    info = corral.job(late)
    assert info["state"] == "DENIED" and "kill_switch_active" in info["last_error"]
    assert switch["target"] == "acme" and switch["scope"] == "tenant"
    report = eventually(
        lambda: (
            corral.run("report", running[0]).returncode == 0 and corral.json("report", running[0])
        ),
        what="the report",
    )
    assert report["outcome"] == "killed"
    assert "kill_switch_activated" in {i["type"] for i in report["incidents"]}
    corral.ok("kill-switch", "off", "--scope", "tenant", "--target", "acme")
    again = corral.submit("true", opts=("--tenant", "acme"))
    assert corral.wait(again, timeout=10) == 0
    corral.ok("cancel", other)


def test_pause_holds_new_runs_and_lets_running_ones_finish(corral: Corral) -> None:
    corral.serve()
    running = corral.submit("sleep", "1")
    assert corral.wait(running, until="running") == 0
    corral.ok("pause", "--reason", "maintenance")
    waiting = corral.submit("true")
    assert corral.wait(running, timeout=10) == 0  # finished normally: a slot is free
    # held: it does not start within a poll_interval_s and more (124: the wait timed out)
    assert corral.wait(waiting, until="running", timeout=1.5) == 124
    assert corral.job(waiting)["state"] == "QUEUED"
    corral.ok("resume")
    assert corral.wait(waiting, timeout=10) == 0
    verdicts = [
        (e["verdict"], e["reason"]) for e in corral.json("trace", waiting)["policy_evaluations"]
    ]
    # held at submit; while the pause is global the dispatcher does not read the queue, so
    # the next decision is the dispatch after the resume
    assert verdicts == [("pause", "runner_paused"), ("allow", "allowed")]


GATED = """
scheduler:
  poll_interval_s: 0.2
approval_ttl_s: {ttl}
roles:
  default: {{}}
  gated:
    requires_approval: true
"""


def test_a_role_that_requires_approval_waits_for_a_human(tmp_path: Path) -> None:
    c = Corral(tmp_path, GATED.format(ttl=120))
    try:
        c.serve()
        approved = c.submit("true", opts=("--role", "gated"))
        refused = c.submit("true", opts=("--role", "gated"))
        assert {c.job(j)["state"] for j in (approved, refused)} == {"AWAITING_APPROVAL"}
        pending = {a["job_id"]: a["id"] for a in c.json("approvals", "list")}
        assert set(pending) == {approved, refused}
        c.ok("approvals", "approve", pending[approved])
        c.ok("approvals", "deny", pending[refused], "--note", "not today")
        assert c.wait(approved, timeout=20) == 0
        c.wait(refused, timeout=20)
        assert c.job(refused)["state"] == "DENIED"
        again = c.run("approvals", "approve", pending[refused])
        assert again.returncode != 0  # decided already
    finally:
        c.stop_all()


def test_an_approval_nobody_gives_expires_into_a_denial(tmp_path: Path) -> None:
    c = Corral(tmp_path, GATED.format(ttl=1))
    try:
        c.serve()
        job = c.submit("true", opts=("--role", "gated"))
        c.wait(job, timeout=20)
        info = c.job(job)
        assert info["state"] == "DENIED" and "approval_expired" in info["last_error"]
        [expired] = c.json("approvals", "list", "--state", "expired")
        assert expired["job_id"] == job
    finally:
        c.stop_all()


LIMITED = """
scheduler:
  poll_interval_s: 0.2
tenants:
  acme: {max_parallel_runs: 1}
roles:
  default: {}
  notebook: {}
"""


def test_parallel_limit_and_spawn_guardrails_deny_before_anything_runs(tmp_path: Path) -> None:
    c = Corral(tmp_path, LIMITED)
    try:
        c.serve()
        first = c.submit("sleep", "600", opts=("--tenant", "acme"))  # until cancelled
        assert c.wait(first, until="running") == 0
        second = c.submit("true", opts=("--tenant", "acme"))
        c.wait(second, timeout=20)
        info = c.job(second)
        assert info["state"] == "DENIED" and "max_parallel_runs_exceeded" in info["last_error"]
        other = c.submit("true", opts=("--tenant", "globex"))  # no limit of its own
        assert c.wait(other, timeout=20) == 0
        # the shipped NotebookAgent role refuses `kubectl delete` of running jobs, also at spawn
        bad = c.submit("kubectl", "delete", "pod", "trainer-0", opts=("--role", "notebook"))
        c.wait(bad, timeout=20)
        info = c.job(bad)
        assert info["state"] == "DENIED" and "no-delete-running-jobs" in info["last_error"]
        [e] = [e for e in c.json("trace", bad)["policy_evaluations"]]  # at submit: never queued
        assert (e["stage"], e["verdict"]) == ("guardrail", "deny")
        c.ok("cancel", first)
    finally:
        c.stop_all()


OVERSEEN = """
scheduler:
  poll_interval_s: 0.2
oversight: {incident_threshold: 2, window_s: 60, min_severity: medium}
roles:
  default: {}
  flaky:
    limits: {max_attempts: 1}
"""


def test_a_role_whose_incident_rate_crosses_the_threshold_is_paused(tmp_path: Path) -> None:
    c = Corral(tmp_path, OVERSEEN)
    try:
        c.serve()
        for _ in range(2):  # a failed run: incidents `failure` and `retry_exhausted`, one mark
            assert c.wait(c.submit("false", opts=("--role", "flaky")), timeout=20) == 1
        eventually(lambda: _paused(c, "flaky"), timeout=20, what="the oversight pause")
        held = c.submit("true", opts=("--role", "flaky"))
        other = c.submit("true")
        assert c.wait(other, timeout=20) == 0  # other roles go on
        eventually(
            lambda: _held_at_dispatch(c, held),
            timeout=10,
            what="a dispatch round to hold the role's job",
        )
        assert c.job(held)["state"] == "QUEUED"
        c.ok("resume", "--scope", "role", "--target", "flaky")
        assert c.wait(held, timeout=20) == 0
    finally:
        c.stop_all()


def _held_at_dispatch(c: Corral, job: str) -> bool:
    """The job was held by a pause both at submit and again by a dispatch round."""
    db = sqlite3.connect(c.data / "corral.db")
    try:
        [held] = db.execute(
            "SELECT COUNT(*) FROM policy_evaluations WHERE job_id = ? AND verdict = 'pause'", (job,)
        ).fetchone()
    finally:
        db.close()
    return int(held) >= 2


def _paused(c: Corral, role: str) -> bool:
    db = sqlite3.connect(c.data / "corral.db")
    try:
        rows = db.execute(
            "SELECT target, actor FROM switch_events WHERE kind = 'pause' AND action = 'activate'"
        ).fetchall()
    finally:
        db.close()
    return (role, "corral-oversight") in rows
