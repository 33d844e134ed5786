"""The metrics reads over SQL (mixed into SqlStore): a handful of GROUP BY queries, so a scrape
costs a few scans whatever the number of jobs (bench/metrics.py measures it)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.ports import TOOL_CALL_STAGES, Distribution, FleetFigures, Tally
from corral.store.driver import Driver, Row, Tx

# in the order of the jobs_metrics index (migration 0016): no sort, no table read
_JOBS = ("SELECT role, env_name, priority, state, "
         "SUM(CASE WHEN dlq_resolution IS NULL THEN 1 ELSE 0 END) AS open_dlq, COUNT(*) AS n "
         "FROM jobs GROUP BY role, env_name, priority, state")
_INFLIGHT = ("SELECT j.role, j.env_name, j.worker, COUNT(*) AS n FROM attempts a "
             "JOIN jobs j ON j.id = a.job_id WHERE a.state IN ('STARTING', 'RUNNING') "
             "GROUP BY j.role, j.env_name, j.worker")
_TOOL_CALLS = ("SELECT verdict, reason, COUNT(*) AS n FROM policy_evaluations "
               f"WHERE stage IN ({', '.join('?' * len(TOOL_CALL_STAGES))}) "
               "AND NOT (stage = 'guardrail' AND subject = 'spawn') GROUP BY verdict, reason")
_USAGE = ("SELECT j.role, j.tenant, j.worker, SUM(e.tokens_in) AS tin, "
          "SUM(e.tokens_out) AS tout, SUM(COALESCE(e.cost_usd, 0)) AS cost "
          "FROM agent_events e JOIN jobs j ON j.id = e.job_id "
          "GROUP BY j.role, j.tenant, j.worker")


def _attempts_sql(n_bounds: int) -> str:
    """Per role: attempts, retries, and both histograms' buckets, count and sum in one pass over
    the attempts_metrics index (each attempt carries its job's role and submit time)."""
    run = "(ended_at - started_at)"
    ran = "ended_at IS NOT NULL AND started_at IS NOT NULL"
    wait = "(started_at - submitted_at)"
    first = "idx = 1 AND started_at IS NOT NULL"
    cols = ["role", "COUNT(*) AS n", "SUM(CASE WHEN idx > 1 THEN 1 ELSE 0 END) AS r",
            f"SUM(CASE WHEN {ran} THEN 1 ELSE 0 END) AS rn",
            f"SUM(CASE WHEN {ran} THEN {run} ELSE 0 END) AS rs",
            f"SUM(CASE WHEN {first} THEN 1 ELSE 0 END) AS wn",
            f"SUM(CASE WHEN {first} THEN {wait} ELSE 0 END) AS ws"]
    cols += [f"SUM(CASE WHEN {ran} AND {run} <= ? THEN 1 ELSE 0 END) AS r{i}"
             for i in range(n_bounds)]
    cols += [f"SUM(CASE WHEN {first} AND {wait} <= ? THEN 1 ELSE 0 END) AS w{i}"
             for i in range(n_bounds)]
    return f"SELECT {', '.join(cols)} FROM attempts WHERE role IS NOT NULL GROUP BY role"


def _tally(row: Row, *names: str) -> Tally:
    return Tally(tuple(str(row[n]) for n in names), float(row["n"]))


def _dist(row: Row, prefix: str, n_bounds: int) -> Distribution:
    return Distribution((str(row["role"]),),
                        tuple(int(row[f"{prefix}{i}"] or 0) for i in range(n_bounds)),
                        int(row[f"{prefix}n"] or 0), float(row[f"{prefix}s"] or 0.0))


class SqlMetrics:
    """Mixed into SqlStore."""

    driver: Driver

    async def fleet_figures(self, bounds: Sequence[float]) -> FleetFigures:
        async with self.driver.read() as tx:
            jobs = await tx.fetchall(_JOBS)
            inflight = await tx.fetchall(_INFLIGHT)
            attempts = await _attempt_rows(tx, bounds)
            tools = await tx.fetchall(_TOOL_CALLS, TOOL_CALL_STAGES)
            usage = await tx.fetchall(_USAGE)
        n = len(bounds)
        return FleetFigures(
            jobs=tuple(_tally(r, "role", "env_name", "priority", "state") for r in jobs),
            dlq=_dlq(jobs),
            inflight=tuple(_tally(r, "role", "env_name", "worker") for r in inflight),
            attempts=tuple(Tally((str(r["role"]),), float(r["n"])) for r in attempts),
            retries=tuple(Tally((str(r["role"]),), float(r["r"] or 0)) for r in attempts),
            attempt_seconds=tuple(_dist(r, "r", n) for r in attempts),
            start_seconds=tuple(_dist(r, "w", n) for r in attempts),
            tool_calls=tuple(_tally(r, "verdict", "reason") for r in tools),
            usage=tuple(((str(r["role"]), str(r["tenant"]), str(r["worker"])), int(r["tin"] or 0),
                         int(r["tout"] or 0), float(r["cost"] or 0.0)) for r in usage))


def _dlq(jobs: Sequence[Row]) -> tuple[Tally, ...]:
    """Unresolved dead-lettered jobs per role, from the jobs' rows."""
    per_role: dict[str, float] = {}
    for r in jobs:
        if r["state"] == "DEAD_LETTERED" and r["open_dlq"]:
            per_role[str(r["role"])] = per_role.get(str(r["role"]), 0.0) + float(r["open_dlq"])
    return tuple(Tally((role,), n) for role, n in sorted(per_role.items()))


async def _attempt_rows(tx: Tx, bounds: Sequence[float]) -> list[Row]:
    params = [float(b) for b in bounds] * 2
    return await tx.fetchall(_attempts_sql(len(bounds)), params)
