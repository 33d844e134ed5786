"""The metrics reads over SQL (mixed into SqlStore): a handful of GROUP BY queries over narrow
indexes, so a scrape costs little whatever the number of jobs (bench/metrics.py measures it).

The attempts' histograms and counts would need every attempt ever run. Instead, an attempt that
ended (its row never changes again) is folded by the next scrape into `metric_rollups` (bucket
counts and sums per role), up to `FOLD_BATCH` a scrape, and marked `folded`, in one write
transaction (migration 0016). A scrape then reads the rollups plus the attempts not folded yet
(the live ones, bounded by the concurrency), so the figures are exact, shared by every engine on
the database, and survive restarts.
Two scrapers never fold one attempt twice: the UPDATE only takes rows still unfolded. Folding is
an optimisation only: when it cannot write (another process holds SQLite's write lock), the
scrape reads the unfolded attempts instead, with the same result.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from corral.core.ports import TOOL_CALL_STAGES, Distribution, FleetFigures, Tally
from corral.domain.errors import StoreError
from corral.store.driver import Driver, Row, Tx
from corral.store.retention import (
    GONE,
    GONE_JOBS,
    GONE_TOOLS,
    labels,
    merge_usage,
)

FOLD_BATCH = 20_000  # attempts folded per scrape at most (the first scrapes of an old store)
OVERFLOW = -1.0  # a rollup's `le` for observations above every bound (the +Inf bucket)
RUN, WAIT, ATTEMPT = "run", "wait", "attempt"  # rollup series; ATTEMPT: le 0 first, 1 retry

# in the order of the jobs_metrics index (migration 0016): no sort, no table read
_JOBS = (
    "SELECT role, env_name, priority, state, "
    "SUM(CASE WHEN dlq_resolution IS NULL THEN 1 ELSE 0 END) AS open_dlq, COUNT(*) AS n "
    "FROM jobs GROUP BY role, env_name, priority, state"
)
_INFLIGHT = (
    "SELECT j.role, j.env_name, j.worker, COUNT(*) AS n FROM attempts a "
    "JOIN jobs j ON j.id = a.job_id WHERE a.state IN ('STARTING', 'RUNNING') "
    "GROUP BY j.role, j.env_name, j.worker"
)
_TOOL_CALLS = (
    "SELECT verdict, reason, COUNT(*) AS n FROM policy_evaluations "
    f"WHERE stage IN ({', '.join('?' * len(TOOL_CALL_STAGES))}) "
    "AND NOT (stage = 'guardrail' AND subject = 'spawn') GROUP BY verdict, reason"
)
_USAGE = (
    "SELECT j.role, j.tenant, j.worker, SUM(e.tokens_in) AS tin, "
    "SUM(e.tokens_out) AS tout, SUM(COALESCE(e.cost_usd, 0)) AS cost "
    "FROM agent_events e JOIN jobs j ON j.id = e.job_id "
    "GROUP BY j.role, j.tenant, j.worker"
)
_UNFOLDED = (
    "SELECT COALESCE(role, '') AS role, idx, started_at, ended_at, submitted_at "
    "FROM attempts WHERE folded = 0"
)
_FOLD = (
    "UPDATE attempts SET folded = 1 WHERE folded = 0 AND id IN (SELECT id FROM attempts "
    "WHERE folded = 0 AND ended_at IS NOT NULL LIMIT ?) "
    "RETURNING COALESCE(role, '') AS role, idx, started_at, ended_at, submitted_at"
)
ADD = (
    "INSERT INTO metric_rollups (series, role, le, n, total) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (series, role, le) DO UPDATE SET n = metric_rollups.n + excluded.n, "
    "total = metric_rollups.total + excluded.total"
)

Key = tuple[str, str, float]  # (series, role, le)


def _observe(sums: dict[Key, list[float]], key: Key, value: float) -> None:
    entry = sums.setdefault(key, [0.0, 0.0])
    entry[0] += 1
    entry[1] += value


def _le(bounds: Sequence[float], value: float) -> float:
    """The upper bound of the bucket an observation falls in (OVERFLOW above them all)."""
    i = bisect.bisect_left(bounds, value)
    return float(bounds[i]) if i < len(bounds) else OVERFLOW


def rollup(rows: Sequence[Row], bounds: Sequence[float]) -> dict[Key, list[float]]:
    """Attempts as rollup entries: (series, role, le) → [count, sum]."""
    sums: dict[Key, list[float]] = {}
    for r in rows:
        role, started = str(r["role"]), r["started_at"]
        _observe(sums, (ATTEMPT, role, 0.0 if int(r["idx"]) == 1 else 1.0), 0.0)
        if started is not None and r["ended_at"] is not None:
            run = float(r["ended_at"]) - float(started)
            _observe(sums, (RUN, role, _le(bounds, run)), run)
        if started is not None and int(r["idx"]) == 1 and r["submitted_at"] is not None:
            wait = float(started) - float(r["submitted_at"])
            _observe(sums, (WAIT, role, _le(bounds, wait)), wait)
    return sums


def _distributions(
    sums: dict[Key, list[float]], series: str, bounds: Sequence[float]
) -> tuple[Distribution, ...]:
    """Per role that ran an attempt (an empty histogram for one with no observation yet)."""
    roles = sorted({role for _, role, _ in sums})
    out = []
    for role in roles:
        mine = [
            (le, n, total) for (s, r, le), (n, total) in sums.items() if s == series and r == role
        ]
        out.append(
            Distribution(
                (role,),
                tuple(
                    int(sum(n for le, n, _ in mine if le != OVERFLOW and le <= b)) for b in bounds
                ),
                int(sum(n for _, n, _ in mine)),
                float(sum(t for _, _, t in mine)),
            )
        )
    return tuple(out)


def _tally(row: Row, *names: str) -> Tally:
    return Tally(tuple(str(row[n]) for n in names), float(row["n"]))


def _plus(tallies: Sequence[Tally], more: Sequence[Tally]) -> tuple[Tally, ...]:
    """Tallies with the same labels added up, by labels."""
    sums: dict[tuple[str, ...], float] = {}
    for t in (*tallies, *more):
        sums[t.labels] = sums.get(t.labels, 0.0) + t.value
    return tuple(Tally(k, v) for k, v in sorted(sums.items()))


def _dlq(jobs: Sequence[Row]) -> tuple[Tally, ...]:
    """Unresolved dead-lettered jobs per role, from the jobs' rows."""
    per_role: dict[str, float] = {}
    for r in jobs:
        if r["state"] == "DEAD_LETTERED" and r["open_dlq"]:
            per_role[str(r["role"])] = per_role.get(str(r["role"]), 0.0) + float(r["open_dlq"])
    return tuple(Tally((role,), n) for role, n in sorted(per_role.items()))


class SqlMetrics:
    """Mixed into SqlStore."""

    driver: Driver

    async def fleet_figures(self, bounds: Sequence[float]) -> FleetFigures:
        await self._fold(bounds)
        async with self.driver.read() as tx:
            jobs = await tx.fetchall(_JOBS)
            inflight = await tx.fetchall(_INFLIGHT)
            sums = await _attempt_sums(tx, bounds)
            tools = await tx.fetchall(_TOOL_CALLS, TOOL_CALL_STAGES)
            usage = await tx.fetchall(_USAGE)
            gone = await tx.fetchall(
                "SELECT series, role, n, total FROM metric_rollups"
                f" WHERE series IN ({', '.join('?' * len(GONE))})",
                GONE,
            )
        attempts: dict[str, float] = {}
        retries: dict[str, float] = {}
        for (series, role, le), (n, _) in sums.items():
            if series == ATTEMPT:
                attempts[role] = attempts.get(role, 0.0) + n
                retries[role] = retries.get(role, 0.0) + (n if le == 1.0 else 0.0)
        return FleetFigures(
            jobs=tuple(_tally(r, "role", "env_name", "priority", "state") for r in jobs),
            dlq=_dlq(jobs),
            inflight=tuple(_tally(r, "role", "env_name", "worker") for r in inflight),
            attempts=tuple(Tally((r,), n) for r, n in sorted(attempts.items())),
            retries=tuple(Tally((r,), n) for r, n in sorted(retries.items())),
            attempt_seconds=_distributions(sums, RUN, bounds),
            start_seconds=_distributions(sums, WAIT, bounds),
            tool_calls=_plus(
                [_tally(r, "verdict", "reason") for r in tools],
                [
                    Tally(labels(r["role"]), float(r["n"]))
                    for r in gone
                    if r["series"] == GONE_TOOLS
                ],
            ),
            usage=merge_usage(
                [
                    (
                        (str(r["role"]), str(r["tenant"]), str(r["worker"])),
                        int(r["tin"] or 0),
                        int(r["tout"] or 0),
                        float(r["cost"] or 0.0),
                    )
                    for r in usage
                ],
                gone,
            ),
            removed=tuple(
                Tally(labels(r["role"]), float(r["n"])) for r in gone if r["series"] == GONE_JOBS
            ),
        )

    async def _fold(self, bounds: Sequence[float]) -> None:
        """Fold settled attempts into the rollups (skipped when the store cannot write now)."""
        try:
            async with self.driver.write() as tx:
                rows = await tx.fetchall(_FOLD, (FOLD_BATCH,))
                for (series, role, le), (n, total) in rollup(rows, bounds).items():
                    await tx.execute(ADD, (series, role, le, int(n), total))
        except StoreError:
            return


async def _attempt_sums(tx: Tx, bounds: Sequence[float]) -> dict[Key, list[float]]:
    """The rollups plus the attempts not folded yet, as rollup entries."""
    sums = rollup(await tx.fetchall(_UNFOLDED), bounds)
    for r in await tx.fetchall(
        "SELECT series, role, le, n, total FROM metric_rollups WHERE series IN (?, ?, ?)",
        (RUN, WAIT, ATTEMPT),
    ):
        le = float(r["le"])
        key = (str(r["series"]), str(r["role"]), le if le == OVERFLOW else _le(bounds, le))
        entry = sums.setdefault(key, [0.0, 0.0])
        entry[0] += float(r["n"])
        entry[1] += float(r["total"])
    return sums
