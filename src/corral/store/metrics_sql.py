"""The metrics reads over SQL (mixed into SqlStore): a handful of GROUP BY queries, so a scrape
costs a few scans whatever the number of jobs (bench/metrics.py measures it)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.ports import TOOL_CALL_STAGES, Distribution, FleetFigures, Tally
from corral.store.driver import Driver, Row, Tx

_JOBS = ("SELECT role, env_name, priority, state, "
         "CASE WHEN dlq_resolution IS NULL THEN 1 ELSE 0 END AS unresolved, COUNT(*) AS n "
         "FROM jobs GROUP BY role, env_name, priority, state, "
         "CASE WHEN dlq_resolution IS NULL THEN 1 ELSE 0 END")
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
    """Per role: attempts, retries, and both histograms' buckets, count and sum in one pass."""
    run = "(a.ended_at - a.started_at)"
    ran = "a.ended_at IS NOT NULL AND a.started_at IS NOT NULL"
    wait = "(a.started_at - j.created_at)"
    first = "a.idx = 1 AND a.started_at IS NOT NULL"
    cols = ["j.role AS role", "COUNT(*) AS n", "SUM(CASE WHEN a.idx > 1 THEN 1 ELSE 0 END) AS r",
            f"SUM(CASE WHEN {ran} THEN 1 ELSE 0 END) AS rn",
            f"SUM(CASE WHEN {ran} THEN {run} ELSE 0 END) AS rs",
            f"SUM(CASE WHEN {first} THEN 1 ELSE 0 END) AS wn",
            f"SUM(CASE WHEN {first} THEN {wait} ELSE 0 END) AS ws"]
    cols += [f"SUM(CASE WHEN {ran} AND {run} <= ? THEN 1 ELSE 0 END) AS r{i}"
             for i in range(n_bounds)]
    cols += [f"SUM(CASE WHEN {first} AND {wait} <= ? THEN 1 ELSE 0 END) AS w{i}"
             for i in range(n_bounds)]
    return (f"SELECT {', '.join(cols)} FROM attempts a JOIN jobs j ON j.id = a.job_id "
            "GROUP BY j.role")


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
            jobs=tuple(_tally(r, "role", "env_name", "priority", "state", "unresolved")
                       for r in jobs),
            inflight=tuple(_tally(r, "role", "env_name", "worker") for r in inflight),
            attempts=tuple(Tally((str(r["role"]),), float(r["n"])) for r in attempts),
            retries=tuple(Tally((str(r["role"]),), float(r["r"] or 0)) for r in attempts),
            attempt_seconds=tuple(_dist(r, "r", n) for r in attempts),
            start_seconds=tuple(_dist(r, "w", n) for r in attempts),
            tool_calls=tuple(_tally(r, "verdict", "reason") for r in tools),
            usage=tuple(((str(r["role"]), str(r["tenant"]), str(r["worker"])), int(r["tin"] or 0),
                         int(r["tout"] or 0), float(r["cost"] or 0.0)) for r in usage))


async def _attempt_rows(tx: Tx, bounds: Sequence[float]) -> list[Row]:
    params = [float(b) for b in bounds] * 2
    return await tx.fetchall(_attempts_sql(len(bounds)), params)
