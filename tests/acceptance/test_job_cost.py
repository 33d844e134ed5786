"""A command job reports its cost in $CORRAL_RESULT_FILE; the core charges it like an agent's:
against the tenant's allowance and the role's retry budget, and the run report counts it."""

from __future__ import annotations

from pathlib import Path

from tests.acceptance.conftest import CONFIG, Corral

COSTLY = (
    CONFIG.replace(
        "roles:\n",
        """roles:
  costly:
    concurrency: 1
    limits: {max_attempts: 5}
    retry: {base_s: 0.05, cap_s: 0.1}
    retry_budget: {cost_usd: 1.0}
""",
    )
    + """\
tenants:
  metered:
    cost_allowance_usd: 1.0
    period: daily
"""
)

SPEND = 'echo \'{"cost_usd": 0.6}\' > "$CORRAL_RESULT_FILE"'


def test_a_command_jobs_reported_cost_is_charged_like_an_agents(tmp_path: Path) -> None:
    c = Corral(tmp_path, COSTLY)
    try:
        c.serve()
        # The role's retry budget: each failing attempt costs 0.6 of 1.0, so the third is
        # refused for good, whatever the role's retry policy would still allow.
        retried = c.submit("sh", "-c", f"{SPEND}; exit 1", opts=("--role", "costly"))
        assert c.wait(retried) != 0
        job = c.job(retried)
        assert job["state"] == "DENIED" and len(job["attempts"]) == 2
        assert job["last_error"].startswith("RETRY_BUDGET_EXHAUSTED: ")
        assert "cost $1.2 of its $1" in job["last_error"]

        # The tenant's allowance: two attempts of 0.6 spend it; the next one waits.
        paid = [c.submit("sh", "-c", SPEND, opts=("--tenant", "metered")) for _ in range(2)]
        assert all(c.wait(j) == 0 for j in paid)
        assert c.json("report", paid[0])["cost_usd"] == 0.6
        spent = c.json("status")["budgets"]["costs"]["metered"]["spent_usd"]
        assert spent == 1.2
        waiting = c.submit("true", opts=("--tenant", "metered"))
        assert c.wait(waiting, until="running", timeout=2) == 124
        refusals = [e for e in c.job(waiting)["timeline"] if e["kind"] == "permit_rejected"]
        assert refusals and refusals[0]["data"]["reason"] == "BUDGET_EXHAUSTED"
    finally:
        c.stop_all()


def test_a_malformed_result_file_costs_nothing_and_says_why(tmp_path: Path) -> None:
    c = Corral(tmp_path, COSTLY)
    try:
        c.serve()
        job = c.submit("sh", "-c", 'echo \'{"cost_usd": -3}\' > "$CORRAL_RESULT_FILE"')
        assert c.wait(job) == 0, "a bad cost report does not fail the job"
        assert c.json("report", job)["cost_usd"] == 0
        assert "cost_usd must be a finite number ≥ 0, got -3" in c.engine_log()
    finally:
        c.stop_all()
