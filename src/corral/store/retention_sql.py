"""Retention over SQL (core/ports.py RetentionStore, mixed into SqlStore; migration 0017).

A job goes with every row of it: attempts, agent events, checkpoints, dependencies and waits, and
its rows on the two chains that belong to jobs (the timeline and the policy evaluations). A chain
is never cut in the middle: what goes of a chain is the segment from its archived head up to
just before the first row of a job that stays (store/retention.py decides which candidates that
leaves), and never past what an event sink has published. `archive_heads` moves to the segment's
end in the transaction that deletes it; the append-only triggers let a DELETE through only at or
below that head, and verification starts from it.

What the metrics count of a job is kept in `metric_rollups` before its rows go (its attempts
folded, its outcome, tokens, cost and tool calls under the `gone_*` series), so no counter goes
backwards (store/metrics_sql.py reads them back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from corral.core.ports import (
    ARCHIVED_CHAINS,
    TOOL_CALL_STAGES,
    ArchiveRecord,
    ChainHead,
    GcBatch,
)
from corral.domain.errors import Conflict
from corral.domain.settings import RetentionSpec
from corral.store.chain_sql import read_heads
from corral.store.driver import Driver, Tx
from corral.store.metrics_sql import ADD, rollup
from corral.store.retention import (
    GONE_JOBS,
    GONE_TOKENS_IN,
    GONE_TOKENS_OUT,
    GONE_TOOLS,
    JOB_TABLES,
    TERMINAL,
    label,
    segments_json,
    segments_of,
)

_T = ", ".join("?" * len(TERMINAL))
# A job retention may take: terminal, not an open dead letter, reported, its parent ended.
_ELIGIBLE = (
    f"state IN ({_T}) AND NOT (state = 'DEAD_LETTERED' AND dlq_resolution IS NULL)"
    " AND id IN (SELECT job_id FROM run_reports)"
    f" AND NOT EXISTS (SELECT 1 FROM jobs p WHERE p.id = jobs.parent_id AND p.state NOT IN ({_T}))"
)
_LEASE = (
    "INSERT INTO gc_lease (name, holder, lease_until) VALUES ('gc', ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
    "lease_until = excluded.lease_until "
    "WHERE gc_lease.holder = excluded.holder OR gc_lease.lease_until < ?"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


async def _archived(tx: Tx) -> dict[str, ChainHead]:
    rows = await tx.fetchall("SELECT chain, seq, hash FROM archive_heads")
    return {str(r["chain"]): ChainHead(int(r["seq"]), str(r["hash"])) for r in rows}


async def _prechain(tx: Tx, job_ids: Sequence[str]) -> set[str]:
    """Jobs with timeline rows from before the chain began: those rows cannot be cut off."""
    ids = sorted(set(job_ids))
    if not ids:
        return set()
    found: set[str] = set()
    for table in ARCHIVED_CHAINS:
        rows = await tx.fetchall(
            f"SELECT DISTINCT job_id FROM {table}"
            f" WHERE seq IS NULL AND job_id IN ({_marks(len(ids))})",
            ids,
        )
        found |= {str(r["job_id"]) for r in rows}
    return found


async def _limits(tx: Tx, sinks: Sequence[str]) -> dict[str, int]:
    """How far each chain may be cut: its tip, and no further than every sink has published."""
    tips = await read_heads(tx)
    cursors = {
        (str(r["sink"]), str(r["source"])): int(r["last_id"])
        for r in await tx.fetchall("SELECT sink, source, last_id FROM event_cursors")
    }
    return {
        table: min(
            [tips[table].seq if table in tips else 0, *(cursors.get((s, table), 0) for s in sinks)]
        )
        for table in ARCHIVED_CHAINS
    }


async def _cuts(
    tx: Tx, going: set[str], base: Mapping[str, ChainHead], limits: Mapping[str, int]
) -> dict[str, int]:
    """Each chain's cut (the last seq that goes) for the jobs in `going`, which loses (in place)
    every job with a row past its chain's cut: the cut is just before the first row of a job that
    stays, so a job dropped lowers it; repeated until no job is dropped. A row of a job that is
    no longer in the store (written to it after it was collected) stays in no one's way."""
    cuts = dict.fromkeys(ARCHIVED_CHAINS, 0)
    while True:
        ids = sorted(going)
        for table in ARCHIVED_CHAINS:
            # the first record of a job that stays (a record of a job gone already goes too)
            others = f" AND job_id NOT IN ({_marks(len(ids))})" if ids else ""
            # (in seq order from the base, stopping at the first: not a scan of every job's)
            row = await tx.fetchone(
                f"SELECT seq AS s FROM {table} t WHERE seq > ?{others}"
                " AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = t.job_id) ORDER BY seq LIMIT 1",
                (base[table].seq, *ids),
            )
            cut = limits[table]
            if row is not None and row["s"] is not None:
                cut = min(cut, int(row["s"]) - 1)
            cuts[table] = max(cut, base[table].seq)
        if not ids:
            return cuts
        late: set[str] = set()
        for table in ARCHIVED_CHAINS:
            for r in await tx.fetchall(
                f"SELECT job_id, MAX(seq) AS s FROM {table}"
                f" WHERE job_id IN ({_marks(len(ids))}) GROUP BY job_id",
                ids,
            ):
                if r["s"] is not None and int(r["s"]) > cuts[table]:
                    late.add(str(r["job_id"]))
        if not late:
            return cuts
        going -= late


class SqlRetention:
    """Mixed into SqlStore."""

    driver: Driver

    async def gc_candidates(self, retention: RetentionSpec, *, now: float, limit: int) -> list[str]:
        found: list[tuple[float, str]] = []
        async with self.driver.read() as tx:
            roles = await tx.fetchall(
                f"SELECT DISTINCT role FROM jobs WHERE state IN ({_T})", TERMINAL
            )
            for role in sorted(str(r["role"]) for r in roles):
                keep = retention.keep(role)
                rows = await tx.fetchall(
                    f"SELECT id, created_at FROM jobs WHERE role = ? AND {_ELIGIBLE}"
                    " AND (updated_at < ? OR id NOT IN (SELECT id FROM jobs"
                    f" WHERE role = ? AND state IN ({_T})"
                    " ORDER BY updated_at DESC, id DESC LIMIT ?))"
                    " ORDER BY created_at, id LIMIT ?",
                    (
                        role,
                        *TERMINAL,
                        *TERMINAL,
                        now - keep.keep_days * 86400.0,
                        role,
                        *TERMINAL,
                        keep.keep_jobs,
                        limit,
                    ),
                )
                found += [(float(r["created_at"]), str(r["id"])) for r in rows]
        return [job_id for _, job_id in sorted(found)[:limit]]

    async def gc_collect(self, job_ids: Sequence[str], *, sinks: Sequence[str]) -> GcBatch:
        async with self.driver.read() as tx:
            archived = await _archived(tx)
            base = {t: archived.get(t, ChainHead(0, "")) for t in ARCHIVED_CHAINS}
            going = set(job_ids) - await _prechain(tx, job_ids)
            cuts = await _cuts(tx, going, base, await _limits(tx, sinks))
            ids = sorted(going)
            rows: dict[str, tuple[Mapping[str, Any], ...]] = {}
            for table, column in JOB_TABLES:
                found = (
                    await tx.fetchall(
                        f"SELECT * FROM {table} WHERE {column} IN ({_marks(len(ids))})", ids
                    )
                    if ids
                    else []
                )
                rows[table] = tuple(dict(r) for r in found)
            for table in ARCHIVED_CHAINS:
                found = await tx.fetchall(
                    f"SELECT * FROM {table} WHERE seq > ? AND seq <= ? ORDER BY seq",
                    (base[table].seq, cuts[table]),
                )
                rows[table] = tuple(dict(r) for r in found)
        return GcBatch(
            jobs=tuple(ids),
            rows=rows,
            segments=segments_of(rows, base),
            dirs=tuple(sorted({str(a["dir"]) for a in rows["attempts"] if a.get("dir")})),
            held=len(set(job_ids)) - len(ids),
        )

    async def gc_remove(
        self, batch: GcBatch, *, archive: str, now: float, bounds: Sequence[float]
    ) -> int:
        ids = list(batch.jobs)
        lock = " FOR UPDATE" if self.driver.dialect == "postgres" else ""
        async with self.driver.write() as tx:
            for table, (before, after) in batch.segments.items():
                await tx.execute(
                    "INSERT INTO archive_heads (chain, seq, hash) VALUES (?, 0, '')"
                    " ON CONFLICT (chain) DO NOTHING",
                    (table,),
                )
                n = await tx.execute(
                    "UPDATE archive_heads SET seq = ?, hash = ? WHERE chain = ? AND seq = ?",
                    (after.seq, after.hash, table, before.seq),
                )
                if n != 1:
                    raise Conflict(
                        f"the archived part of {table} moved since this batch was read "
                        "(another engine is collecting): try again"
                    )
            if ids:
                marks = _marks(len(ids))
                jobs = await tx.fetchall(
                    f"SELECT id FROM jobs WHERE id IN ({marks}) AND state IN ({_T}){lock}",
                    (*ids, *TERMINAL),
                )
                if len(jobs) != len(ids):
                    raise Conflict("a job of this batch is gone or not terminal: try again")
                await self._keep_figures(tx, ids, batch, bounds)
                for table, column in reversed(JOB_TABLES):
                    await tx.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", ids)
            for table, (before, after) in batch.segments.items():
                await tx.execute(
                    f"DELETE FROM {table} WHERE seq > ? AND seq <= ?", (before.seq, after.seq)
                )
            await tx.execute(
                "INSERT INTO archives (at, file, jobs, segments) VALUES (?, ?, ?, ?)",
                (now, archive, len(ids), segments_json(batch.segments)),
            )
        return len(ids)

    async def _keep_figures(
        self, tx: Tx, ids: Sequence[str], batch: GcBatch, bounds: Sequence[float]
    ) -> None:
        """Put what the metrics count of these jobs into the rollups before their rows go."""
        marks = _marks(len(ids))
        folded = await tx.fetchall(
            f"UPDATE attempts SET folded = 1 WHERE folded = 0 AND job_id IN ({marks}) "
            "RETURNING COALESCE(role, '') AS role, idx, started_at, ended_at, submitted_at",
            ids,
        )
        adds: list[tuple[str, str, float, int, float]] = [
            (series, role, le, int(n), total)
            for (series, role, le), (n, total) in rollup(folded, bounds).items()
        ]
        for r in await tx.fetchall(
            "SELECT role, env_name, priority, state, COUNT(*) AS n FROM jobs"
            f" WHERE id IN ({marks}) GROUP BY role, env_name, priority, state",
            ids,
        ):
            key = label(r["role"], r["env_name"], r["priority"], r["state"])
            adds.append((GONE_JOBS, key, 0.0, int(r["n"]), 0.0))
        for r in await tx.fetchall(
            "SELECT j.role, j.tenant, j.worker, SUM(e.tokens_in) AS tin, "
            "SUM(e.tokens_out) AS tout, SUM(COALESCE(e.cost_usd, 0)) AS cost "
            f"FROM agent_events e JOIN jobs j ON j.id = e.job_id WHERE j.id IN ({marks}) "
            "GROUP BY j.role, j.tenant, j.worker",
            ids,
        ):
            key = label(r["role"], r["tenant"], r["worker"])
            adds.append((GONE_TOKENS_IN, key, 0.0, int(r["tin"] or 0), float(r["cost"] or 0.0)))
            adds.append((GONE_TOKENS_OUT, key, 0.0, int(r["tout"] or 0), 0.0))
        seg = batch.segments.get("policy_evaluations")
        if seg is not None and seg[1].seq > seg[0].seq:
            for r in await tx.fetchall(
                "SELECT verdict, reason, COUNT(*) AS n FROM policy_evaluations "
                f"WHERE seq > ? AND seq <= ? AND stage IN ({_marks(len(TOOL_CALL_STAGES))}) "
                "AND NOT (stage = 'guardrail' AND subject = 'spawn') GROUP BY verdict, reason",
                (seg[0].seq, seg[1].seq, *TOOL_CALL_STAGES),
            ):
                adds.append((GONE_TOOLS, label(r["verdict"], r["reason"]), 0.0, int(r["n"]), 0.0))
        for add in adds:
            await tx.execute(ADD, add)

    async def gc_known(self, job_ids: Sequence[str]) -> set[str]:
        ids = sorted(set(job_ids))
        if not ids:
            return set()
        async with self.driver.read() as tx:
            rows = await tx.fetchall(f"SELECT id FROM jobs WHERE id IN ({_marks(len(ids))})", ids)
        return {str(r["id"]) for r in rows}

    async def archived_heads(self) -> dict[str, ChainHead]:
        async with self.driver.read() as tx:
            return await _archived(tx)

    async def archives(self) -> list[ArchiveRecord]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT id, at, file, jobs, segments FROM archives ORDER BY id"
            )
        return [
            ArchiveRecord(
                id=int(r["id"]),
                at=float(r["at"]),
                file=str(r["file"]),
                jobs=int(r["jobs"]),
                segments={
                    t: (ChainHead(a, ah), ChainHead(b, bh))
                    for t, (a, ah, b, bh) in json.loads(r["segments"]).items()
                },
            )
            for r in rows
        ]

    async def claim_gc(self, holder: str, *, now: float, lease_s: float) -> bool:
        async with self.driver.write() as tx:
            n = await tx.execute(_LEASE, (holder, now + lease_s, now))
        return n == 1

    async def release_gc(self, holder: str) -> None:
        async with self.driver.write() as tx:
            await tx.execute("DELETE FROM gc_lease WHERE name = 'gc' AND holder = ?", (holder,))
