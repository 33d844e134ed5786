"""The knowledge flywheel over SQL (mixed into SqlStore; migration 0023): learnings with their
append-only history, citations and A/B runs. Full-text search is the database's own: SQLite's
FTS5 table `learnings_fts` (porter stemming), PostgreSQL's generated tsvector column `search`
(english); both take any of the query's words and rank by their relevance (bm25, ts_rank)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.domain.errors import StaleState
from corral.domain.ids import MIN_REF, resolve
from corral.domain.knowledge import (
    Arm,
    ArmStats,
    Citation,
    KnowledgeRun,
    Learning,
    LearningChange,
    LearningKind,
    LearningStatus,
    LearningUpdate,
    Maturity,
    Provenance,
    Tier,
)
from corral.knowledge.retrieval import search_terms
from corral.store.driver import Driver, Row, Tx
from corral.store.rows import ref_clause

_COLUMNS = (
    "id, tenant, role, kind, title, body, digest, score, tier, confidence, utility, maturity,"
    " status, job_id, attempt, git_commit, created_at, updated_at, reward_count, helpful_count,"
    " harmful_count, last_reward_at, citations"
)
_L_COLUMNS = ", ".join(f"l.{c.strip()}" for c in _COLUMNS.split(","))
_EVENT_COLUMNS = (
    "learning_id, at, action, actor, reason, job_id, utility_before, utility_after,"
    " confidence_before, confidence_after, maturity_before, maturity_after, status_before,"
    " status_after"
)


def learning_from_row(r: Row) -> Learning:
    return Learning(
        id=r["id"],
        tenant=r["tenant"],
        role=r["role"],
        kind=LearningKind(r["kind"]),
        title=r["title"],
        body=r["body"],
        digest=r["digest"],
        score=float(r["score"]),
        tier=Tier(r["tier"]),
        confidence=float(r["confidence"]),
        utility=float(r["utility"]),
        maturity=Maturity(r["maturity"]),
        status=LearningStatus(r["status"]),
        provenance=Provenance(job_id=r["job_id"], attempt=r["attempt"], commit=r["git_commit"]),
        created_at=float(r["created_at"]),
        updated_at=float(r["updated_at"]),
        reward_count=int(r["reward_count"]),
        helpful_count=int(r["helpful_count"]),
        harmful_count=int(r["harmful_count"]),
        last_reward_at=None if r["last_reward_at"] is None else float(r["last_reward_at"]),
        citations=int(r["citations"]),
    )


def _learning_params(x: Learning) -> tuple[Any, ...]:
    return (
        x.id,
        x.tenant,
        x.role,
        x.kind.value,
        x.title,
        x.body,
        x.digest,
        x.score,
        x.tier.value,
        x.confidence,
        x.utility,
        x.maturity.value,
        x.status.value,
        x.provenance.job_id,
        x.provenance.attempt,
        x.provenance.commit,
        x.created_at,
        x.updated_at,
        x.reward_count,
        x.helpful_count,
        x.harmful_count,
        x.last_reward_at,
        x.citations,
    )


def _change_params(c: LearningChange) -> tuple[Any, ...]:
    return (
        c.learning_id,
        c.at,
        c.action,
        c.actor,
        c.reason,
        c.job_id,
        c.utility_before,
        c.utility_after,
        c.confidence_before,
        c.confidence_after,
        c.maturity_before,
        c.maturity_after,
        c.status_before,
        c.status_after,
    )


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


def change_from_row(r: Row) -> LearningChange:
    return LearningChange(
        seq=int(r["seq"]),
        learning_id=r["learning_id"],
        at=float(r["at"]),
        action=r["action"],
        actor=r["actor"],
        reason=r["reason"],
        job_id=r["job_id"],
        utility_before=_opt(r["utility_before"]),
        utility_after=_opt(r["utility_after"]),
        confidence_before=_opt(r["confidence_before"]),
        confidence_after=_opt(r["confidence_after"]),
        maturity_before=r["maturity_before"],
        maturity_after=r["maturity_after"],
        status_before=r["status_before"],
        status_after=r["status_after"],
    )


def citation_from_row(r: Row) -> Citation:
    return Citation(
        learning_id=r["learning_id"],
        job_id=r["job_id"],
        attempt=int(r["attempt"]),
        at=float(r["at"]),
        rank=int(r["rank"]),
        score=float(r["score"]),
        reward=_opt(r["reward"]),
    )


def _scope(
    tenant: str | None,
    role: str | None,
    status: LearningStatus | None,
    kind: LearningKind | None = None,
    tier: Tier | None = None,
) -> tuple[str, list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("tenant", tenant),
        ("role", role),
        ("status", status and status.value),
        ("kind", kind and kind.value),
        ("tier", tier and tier.value),
    ):
        if value is not None:
            where.append(f"l.{column} = ?")
            params.append(value)
    return " AND ".join(where), params


class SqlKnowledge:
    """Mixed into SqlStore."""

    driver: Driver

    async def add_learning(self, learning: Learning, change: LearningChange) -> bool:
        async with self.driver.write() as tx:
            found = await tx.fetchone(
                "SELECT id FROM learnings WHERE tenant = ? AND role = ? AND digest = ?",
                (learning.tenant, learning.role, learning.digest),
            )
            if found is not None:
                return False
            marks = ", ".join("?" * len(_COLUMNS.split(",")))
            await tx.execute(
                f"INSERT INTO learnings ({_COLUMNS}) VALUES ({marks})", _learning_params(learning)
            )
            await self._history(tx, change)
        return True

    async def _history(self, tx: Tx, change: LearningChange) -> None:
        await tx.execute(
            f"INSERT INTO learning_events ({_EVENT_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _change_params(change),
        )

    async def get_learning(self, ref: str) -> Learning:
        async with self.driver.read() as tx:
            row = await tx.fetchone(f"SELECT {_COLUMNS} FROM learnings WHERE id = ?", (ref,))
            if row is None and len(ref) >= MIN_REF:
                rows = await tx.fetchall(
                    "SELECT id FROM learnings WHERE id LIKE ? OR id LIKE ? LIMIT 6",
                    (_like(ref) + "%", "%" + _like(ref)),
                )
                found = resolve(ref, (str(r["id"]) for r in rows), "learning")
                row = await tx.fetchone(f"SELECT {_COLUMNS} FROM learnings WHERE id = ?", (found,))
        if row is None:
            resolve(ref, (), "learning")  # raises NotFound
        assert row is not None
        return learning_from_row(row)

    async def list_learnings(
        self,
        *,
        tenant: str | None = None,
        role: str | None = None,
        status: LearningStatus | None = None,
        limit: int = 100,
        kind: LearningKind | None = None,
        tier: Tier | None = None,
        ref: str | None = None,
    ) -> list[Learning]:
        where, params = _scope(tenant, role, status, kind, tier)
        if ref is not None:
            named, values = ref_clause("l.id", ref)
            where = f"{where} AND {named}" if where else named
            params += values
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT {_L_COLUMNS} FROM learnings l"
                f"{' WHERE ' + where if where else ''} ORDER BY l.seq DESC LIMIT ?",
                (*params, limit),
            )
        return [learning_from_row(r) for r in rows]

    async def search_learnings(
        self,
        query: str,
        *,
        tenant: str | None = None,
        role: str | None = None,
        status: LearningStatus | None = LearningStatus.ACTIVE,
        limit: int = 50,
        kind: LearningKind | None = None,
        tier: Tier | None = None,
    ) -> list[Learning]:
        terms = search_terms(query)
        if not terms:
            return await self.list_learnings(
                tenant=tenant, role=role, status=status, limit=limit, kind=kind, tier=tier
            )
        where, params = _scope(tenant, role, status, kind, tier)
        extra = f" AND {where}" if where else ""
        async with self.driver.read() as tx:
            if self.driver.dialect == "sqlite":
                match = " OR ".join(f'"{t}"' for t in terms)
                rows = await tx.fetchall(
                    f"SELECT {_L_COLUMNS} FROM learnings_fts JOIN learnings l"
                    f" ON l.seq = learnings_fts.rowid WHERE learnings_fts MATCH ?{extra}"
                    " ORDER BY bm25(learnings_fts), l.seq DESC LIMIT ?",
                    (match, *params, limit),
                )
            else:
                tsquery = " | ".join(terms)
                rows = await tx.fetchall(
                    f"SELECT {_L_COLUMNS} FROM learnings l"
                    f" WHERE l.search @@ to_tsquery('english', ?){extra}"
                    " ORDER BY ts_rank(l.search, to_tsquery('english', ?)) DESC, l.seq DESC"
                    " LIMIT ?",
                    (tsquery, *params, tsquery, limit),
                )
        return [learning_from_row(r) for r in rows]

    async def _apply(self, tx: Tx, updates: Sequence[LearningUpdate]) -> None:
        for u in updates:
            a = u.after
            n = await tx.execute(
                "UPDATE learnings SET confidence = ?, utility = ?, maturity = ?, status = ?,"
                " updated_at = ?, reward_count = ?, helpful_count = ?, harmful_count = ?,"
                " last_reward_at = ? WHERE id = ? AND updated_at = ?",
                (
                    a.confidence,
                    a.utility,
                    a.maturity.value,
                    a.status.value,
                    a.updated_at,
                    a.reward_count,
                    a.helpful_count,
                    a.harmful_count,
                    a.last_reward_at,
                    a.id,
                    u.before.updated_at,
                ),
            )
            if n != 1:
                raise StaleState(f"learning {a.id} changed meanwhile")
            await self._history(tx, u.change)

    async def update_learnings(self, updates: Sequence[LearningUpdate]) -> None:
        async with self.driver.write() as tx:
            await self._apply(tx, updates)

    async def learning_history(self, learning_id: str) -> list[LearningChange]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT seq, {_EVENT_COLUMNS} FROM learning_events WHERE learning_id = ?"
                " ORDER BY seq",
                (learning_id,),
            )
        return [change_from_row(r) for r in rows]

    async def record_injection(self, run: KnowledgeRun, citations: Sequence[Citation]) -> None:
        async with self.driver.write() as tx:
            await tx.execute(
                "INSERT INTO knowledge_runs (job_id, attempt, tenant, role, arm, reason, injected,"
                " started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET"
                " attempt = excluded.attempt, arm = excluded.arm, reason = excluded.reason,"
                " injected = excluded.injected, started_at = excluded.started_at",
                (
                    run.job_id,
                    run.attempt,
                    run.tenant,
                    run.role,
                    run.arm.value,
                    run.reason,
                    run.injected,
                    run.started_at,
                ),
            )
            for c in citations:
                n = await tx.execute(
                    "INSERT INTO knowledge_citations (learning_id, job_id, attempt, at, rank,"
                    " score) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (c.learning_id, c.job_id, c.attempt, c.at, c.rank, c.score),
                )
                if n:
                    await tx.execute(
                        "UPDATE learnings SET citations = citations + 1 WHERE id = ?",
                        (c.learning_id,),
                    )

    async def citations(
        self, *, job_id: str | None = None, learning_id: str | None = None
    ) -> list[Citation]:
        where: list[str] = []
        params: list[Any] = []
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        if learning_id is not None:
            where.append("learning_id = ?")
            params.append(learning_id)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT learning_id, job_id, attempt, at, rank, score, reward"
                f" FROM knowledge_citations{' WHERE ' + ' AND '.join(where) if where else ''}"
                " ORDER BY at, job_id, attempt, rank",
                params,
            )
        return [citation_from_row(r) for r in rows]

    async def settle_run(
        self,
        job_id: str,
        *,
        succeeded: bool,
        tool_calls: int,
        reward: float | None,
        updates: Sequence[LearningUpdate],
    ) -> None:
        async with self.driver.write() as tx:
            await tx.execute(
                "UPDATE knowledge_runs SET succeeded = ?, tool_calls = ? WHERE job_id = ?",
                (1 if succeeded else 0, tool_calls, job_id),
            )
            if reward is not None:
                await tx.execute(
                    "UPDATE knowledge_citations SET reward = ? WHERE job_id = ? AND reward IS NULL",
                    (reward, job_id),
                )
            await self._apply(tx, updates)

    async def mark_settle_due(self, job_ids: Sequence[str], at: float) -> None:
        if not job_ids:
            return
        async with self.driver.write() as tx:
            for job_id in job_ids:
                await tx.execute(
                    "INSERT INTO knowledge_due (job_id, due_at) VALUES (?, ?)"
                    " ON CONFLICT (job_id) DO UPDATE SET due_at = excluded.due_at",
                    (job_id, at),
                )

    async def settle_due(self, before: float, limit: int) -> list[str]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT job_id FROM knowledge_due WHERE due_at < ? ORDER BY due_at, job_id LIMIT ?",
                (before, limit),
            )
        return [str(r["job_id"]) for r in rows]

    async def settled(self, job_id: str) -> None:
        async with self.driver.write() as tx:
            await tx.execute("DELETE FROM knowledge_due WHERE job_id = ?", (job_id,))

    async def knowledge_stats(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> list[ArmStats]:
        where = ["succeeded IS NOT NULL"]
        params: list[Any] = []
        for column, value in (("tenant", tenant), ("role", role)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT role, arm, COUNT(*) AS runs, SUM(succeeded) AS ok,"
                " SUM(COALESCE(tool_calls, 0)) AS calls FROM knowledge_runs"
                f" WHERE {' AND '.join(where)} GROUP BY role, arm ORDER BY role, arm",
                params,
            )
        return [
            ArmStats(
                role=r["role"],
                arm=Arm(r["arm"]),
                runs=int(r["runs"]),
                succeeded=int(r["ok"] or 0),
                tool_calls=int(r["calls"] or 0),
            )
            for r in rows
        ]

    async def learning_counts(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> dict[tuple[str, str], int]:
        where, params = _scope(tenant, role, None)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT l.role AS role, l.status AS status, COUNT(*) AS n FROM learnings l"
                f"{' WHERE ' + where if where else ''} GROUP BY l.role, l.status",
                params,
            )
        return {(r["role"], r["status"]): int(r["n"]) for r in rows}


def _like(text: str) -> str:
    """`text` as a literal inside a LIKE pattern (ids hold no `%` or `_` but a ref might)."""
    return text.replace("%", "").replace("_", "")
