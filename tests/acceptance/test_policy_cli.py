"""`corral budget`, `corral dark-launch` and `corral policy check|log|stats` through the real
`corral` command, with a real engine where the engine's decisions matter."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import CONFIG, Corral
from tests.helpers import eventually

METERED = CONFIG.replace(
    "environments:",
    """\
  metered:
    concurrency: 4
    cost_estimate_usd: 0.4
  gated:
    requires_approval: true
tenants:
  acme: {max_parallel_runs: 1}
environments:""",
)


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[Corral]:
    c = Corral(tmp_path, METERED)
    try:
        yield c
    finally:
        c.stop_all()


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """A refused command: the exit code, nothing on stdout, one line on stderr naming `words`."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("corral: error: ")
    assert all(w in line for w in words), line


def check(corral: Corral, *args: str) -> tuple[int, dict[str, Any]]:
    r = corral.run("policy", "check", *args, "--json")
    assert r.returncode in (0, 1, 8, 9), r.stderr
    return r.returncode, json.loads(r.stdout)


# ---- budget ----------------------------------------------------------------------------------


def test_budget_set_latest_wins_and_status_shows_the_period(corral: Corral) -> None:
    out = corral.ok(
        "budget",
        "set",
        "--scope",
        "tenant",
        "--target",
        "acme",
        "--period",
        "daily",
        "--ceiling-usd",
        "5",
    )
    assert "tenant acme" in out and "$5.00 daily" in out
    again = corral.json(
        "budget",
        "set",
        "--scope",
        "tenant",
        "--target",
        "acme",
        "--period",
        "monthly",
        "--ceiling-usd",
        "7.5",
    )
    assert again["previous"] == {
        "scope": "tenant",
        "target": "acme",
        "period": "daily",
        "ceiling_usd": 5.0,
    }
    corral.ok(
        "budget",
        "set",
        "--scope",
        "role",
        "--target",
        "default",
        "--period",
        "rolling_30d",
        "--ceiling-usd",
        "2",
    )
    rows = corral.json("budget", "status")
    assert [(r["scope"], r["target"], r["period"], r["ceiling_usd"]) for r in rows] == [
        ("role", "default", "rolling_30d", 2.0),
        ("tenant", "acme", "monthly", 7.5),
    ]
    tenant = rows[1]
    start = dt.datetime.fromisoformat(tenant["period_start"])
    assert (start.day, start.hour, start.minute, start.utcoffset()) == (
        1,
        0,
        0,
        dt.timedelta(0),
    )  # the first of the month, midnight UTC
    assert (tenant["spent_usd"], tenant["reserved_usd"], tenant["headroom_usd"]) == (0.0, 0.0, 7.5)
    assert tenant["resets_at"] is not None and rows[0]["resets_at"] is None
    only = corral.json("budget", "status", "--scope", "role")
    assert [r["target"] for r in only] == ["default"]
    assert corral.json("budget", "status", "--target", "nobody") == []
    table = corral.ok("budget", "status")
    assert "acme" in table and "$7.50" in table and "rolling_30d" in table


def test_budget_bad_input_is_one_line(corral: Corral) -> None:
    base = ("budget", "set", "--target", "acme", "--period", "daily", "--ceiling-usd", "5")
    one_line_error(corral.run(*base, "--scope", "global"), 2, "--scope", "tenant or role")
    one_line_error(
        corral.run(
            "budget",
            "set",
            "--scope",
            "tenant",
            "--target",
            "acme",
            "--period",
            "weekly",
            "--ceiling-usd",
            "5",
        ),
        2,
        "--period",
        "rolling_30d",
    )
    one_line_error(
        corral.run(
            "budget",
            "set",
            "--scope",
            "tenant",
            "--target",
            "acme",
            "--period",
            "daily",
            "--ceiling-usd",
            "-1",
        ),
        2,
        "--ceiling-usd",
    )
    one_line_error(corral.run("budget", "status", "--scope", "job"), 2, "--scope")
    assert corral.json("budget", "status") == []


def test_budget_status_counts_a_running_reservation_and_check_denies_past_it(
    metered: Corral,
) -> None:
    corral = metered
    corral.ok(
        "budget",
        "set",
        "--scope",
        "role",
        "--target",
        "metered",
        "--period",
        "daily",
        "--ceiling-usd",
        "1",
    )
    corral.serve()
    job = corral.submit("sleep", "600", opts=("--role", "metered", "--tenant", "acme"))
    assert corral.wait(job, until="running") == 0
    # the tenant's parallel limit (1) counts the running job; a role that needs approval asks
    code, d = check(corral, "--role", "default", "--tenant", "acme")
    assert (code, d["reason"], d["step"]) == (1, "max_parallel_runs_exceeded", "parallel_limit")
    assert d["snapshot"]["parallel_limit"]["active_job_ids"] == [corral.job(job)["id"]]
    code, d = check(corral, "--role", "gated")
    assert (code, d["verdict"], d["reason"], d["step"]) == (
        8,
        "require_approval",
        "approval_required",
        "approval",
    )
    [row] = corral.json("budget", "status", "--scope", "role", "--target", "metered")
    assert row["reserved_usd"] == pytest.approx(0.4)
    assert row["headroom_usd"] == pytest.approx(0.6)
    code, d = check(corral, "--role", "metered")
    assert (code, d["verdict"], d["step"]) == (0, "allow", "none")  # 0.4 + 0.4 ≤ 1
    corral.ok(
        "budget",
        "set",
        "--scope",
        "role",
        "--target",
        "metered",
        "--period",
        "daily",
        "--ceiling-usd",
        "0.7",
    )
    code, d = check(corral, "--role", "metered")
    assert (code, d["verdict"], d["reason"], d["step"]) == (
        1,
        "deny",
        "budget_ceiling_exceeded",
        "budget",
    )
    [ceiling] = d["snapshot"]["budget"]["ceilings"]
    assert ceiling["reserved_usd"] == pytest.approx(0.4) and ceiling["admits"] is False
    code, d = check(corral, "--role", "metered", "--estimate-usd", "0.2")
    assert code == 0 and d["snapshot"]["budget"]["estimate_usd"] == 0.2
    corral.ok("cancel", job)
    corral.wait(job)
    [row] = eventually(
        lambda: [r for r in corral.json("budget", "status") if r["reserved_usd"] == 0],
        what="the reservation settled",
    )
    assert row["spent_usd"] == 0.0  # a command costs nothing: the reservation is released


# ---- dark launch -----------------------------------------------------------------------------


def test_dark_launch_enable_status_disable(corral: Corral) -> None:
    on = corral.json("dark-launch", "enable", "wf_a", "--percentage", "50")
    assert on == {
        "workflow": "wf_a",
        "set": True,
        "enabled": True,
        "percentage": 50,
        "position": 94,
        "in_window": False,
        "runs": False,
    }
    corral.ok("dark-launch", "enable", "nightly-eval", "--percentage", "50")
    one = corral.json("dark-launch", "status", "nightly-eval")
    assert (one["position"], one["in_window"], one["runs"]) == (28, True, True)
    text = corral.ok("dark-launch", "status", "wf_a")
    assert "position 94" in text and "outside the window" in text
    assert "dark_launch_excluded" in text
    unset = corral.json("dark-launch", "status", "ingest/daily")  # docs' test vector: 40
    assert (unset["set"], unset["position"], unset["in_window"], unset["runs"]) == (
        False,
        40,
        None,
        True,
    )
    assert [d["workflow"] for d in corral.json("dark-launch", "status")] == ["nightly-eval", "wf_a"]
    off = corral.json("dark-launch", "disable", "wf_a")
    assert (off["enabled"], off["percentage"], off["runs"]) == (False, 50, True)
    assert corral.json("dark-launch", "status", "wf_a")["enabled"] is False
    one_line_error(
        corral.run("dark-launch", "enable", "wf_a", "--percentage", "101"),
        2,
        "--percentage",
        "0 … 100",
    )
    one_line_error(corral.run("dark-launch", "disable", "never-set"), 4, "never-set")


def test_the_engine_follows_the_dark_launch_and_check_agrees(corral: Corral) -> None:
    corral.serve()
    corral.ok("dark-launch", "enable", "wf_a", "--percentage", "50")
    corral.ok("dark-launch", "enable", "nightly-eval", "--percentage", "50")
    code, d = check(corral, "--role", "default", "--workflow", "wf_a")
    assert (code, d["reason"], d["snapshot"]["dark_launch"]["position"]) == (
        1,
        "dark_launch_excluded",
        94,
    )
    code, d = check(corral, "--role", "default", "--workflow", "nightly-eval")
    assert (code, d["verdict"]) == (0, "allow")
    out = corral.submit("true", opts=("--key", "wf_a"))  # the key is the workflow
    inside = corral.submit("true", opts=("--key", "nightly-eval"))
    assert corral.wait(inside) == 0
    corral.wait(out)
    info = corral.job(out)
    assert info["state"] == "DENIED" and "dark_launch_excluded" in info["last_error"]
    [e] = corral.json("policy", "log", "--job", out)
    assert (e["job"], e["stage"], e["subject"], e["verdict"], e["reason"]) == (
        info["id"],
        "pre_run",
        "dark_launch",
        "deny",
        "dark_launch_excluded",
    )
    assert e["inputs"]["dark_launch"]["position"] == 94


# ---- policy check ----------------------------------------------------------------------------


def test_policy_check_follows_kill_switches_and_pauses_and_writes_nothing(corral: Corral) -> None:
    corral.serve()
    code, d = check(corral, "--role", "default", "--tenant", "acme")
    assert (code, d["verdict"], d["reason"], d["step"]) == (0, "allow", "allowed", "none")
    assert set(d["snapshot"]) >= {"job", "kill_switch", "pause", "budget", "dark_launch"}
    corral.ok("kill-switch", "on", "--scope", "tenant", "--target", "acme", "--reason", "leak")
    r = corral.run("policy", "check", "--role", "default", "--tenant", "acme")
    assert r.returncode == 1
    assert r.stdout.startswith("deny  reason=kill_switch_active  step=kill_switch")
    assert "leak" in r.stdout
    code, d = check(corral, "--role", "default", "--tenant", "acme")
    [switch] = d["snapshot"]["kill_switch"]["active_in_scope"]
    assert (switch["scope"], switch["target"], switch["reason"]) == ("tenant", "acme", "leak")
    assert check(corral, "--role", "default", "--tenant", "globex")[0] == 0  # out of scope
    corral.ok("pause", "--scope", "role", "--target", "serial", "--reason", "maintenance")
    code, d = check(corral, "--role", "serial")
    assert (code, d["verdict"], d["reason"], d["step"]) == (9, "pause", "runner_paused", "pause")
    corral.ok("resume", "--scope", "role", "--target", "serial")
    corral.ok("kill-switch", "off", "--scope", "tenant", "--target", "acme")
    assert check(corral, "--role", "default", "--tenant", "acme")[0] == 0
    assert corral.json("policy", "stats")["total"] == 0  # a check records nothing
    one_line_error(corral.run("policy", "check", "--role", "nope"), 2, "unknown role 'nope'")


# ---- policy log and stats --------------------------------------------------------------------


def test_policy_log_and_stats_across_jobs(corral: Corral) -> None:
    corral.serve()
    corral.ok("kill-switch", "on", "--scope", "tenant", "--target", "acme", "--reason", "leak")
    denied = corral.submit("true", opts=("--tenant", "acme"))
    allowed = corral.submit("true")
    assert corral.wait(allowed) == 0
    corral.wait(denied)
    denied_id, allowed_id = corral.job(denied)["id"], corral.job(allowed)["id"]
    log = corral.json("policy", "log")
    assert {(e["job"], e["verdict"], e["reason"]) for e in log} == {
        (denied_id, "deny", "kill_switch_active"),
        (allowed_id, "allow", "allowed"),
    }
    assert all(e["stage"] == "pre_run" and e["attempt"] == 1 for e in log)
    assert log == sorted(log, key=lambda e: e["id"])  # oldest first, newest last
    [deny] = corral.json("policy", "log", "--verdict", "deny")
    assert deny["job"] == denied_id and deny["subject"] == "kill_switch"
    assert "leak" in deny["message"]
    assert corral.json("policy", "log", "--stage", "tool_call") == []
    assert [e["job"] for e in corral.json("policy", "log", "--limit", "1")] == [log[-1]["job"]]
    # evaluated at submit and again when dispatched
    assert [e["job"] for e in corral.json("policy", "log", "--job", allowed)] == [allowed_id] * 2
    assert corral.json("policy", "log", "--job", allowed, "--verdict", "deny") == []
    table = corral.ok("policy", "log")
    assert denied_id in table and "kill_switch_active" in table
    stats = corral.json("policy", "stats")
    assert stats["total"] == 3 and stats["since"] is None
    assert {(c["stage"], c["verdict"], c["reason"]): c["count"] for c in stats["counts"]} == {
        ("pre_run", "deny", "kill_switch_active"): 1,
        ("pre_run", "allow", "allowed"): 2,
    }
    assert corral.json("policy", "stats", "--since", "3600")["total"] == 3
    assert corral.json("policy", "stats", "--since", "0")["counts"] == []
    text = corral.ok("policy", "stats")
    assert "kill_switch_active" in text and "3 evaluation(s)" in text
    one_line_error(corral.run("policy", "log", "--verdict", "maybe"), 2, "--verdict")
    one_line_error(corral.run("policy", "log", "--limit", "0"), 2, "--limit")
    one_line_error(corral.run("policy", "log", "--job", "ZZZZZZZZ"), 4)
    one_line_error(corral.run("policy", "stats", "--since", "-5"), 2, "--since")
