"""The knowledge flywheel in memory, with the semantics of store/knowledge_sql.py (its search
matches any of the query's words, ranked by how many it holds: the SQL stores use the
database's full-text index)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from corral.domain.errors import StaleState
from corral.domain.ids import matches, resolve
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
    Tier,
)
from corral.knowledge.retrieval import search_terms


class MemoryKnowledge:
    """Mixed into MemoryStore."""

    _learnings: dict[str, Learning]  # in insertion order
    _learning_events: list[LearningChange]
    _citations: dict[tuple[str, int, str], Citation]
    _knowledge_runs: dict[str, KnowledgeRun]
    _knowledge_due: dict[str, float]  # job id → when its run was marked to settle

    def _init_knowledge(self) -> None:
        self._learnings = {}
        self._learning_events = []
        self._citations = {}
        self._knowledge_runs = {}
        self._knowledge_due = {}

    def _history(self, change: LearningChange) -> None:
        self._learning_events.append(replace(change, seq=len(self._learning_events) + 1))

    async def add_learning(self, learning: Learning, change: LearningChange) -> bool:
        for x in self._learnings.values():
            if (x.tenant, x.role, x.digest) == (learning.tenant, learning.role, learning.digest):
                return False
        self._learnings[learning.id] = learning
        self._history(change)
        return True

    async def get_learning(self, ref: str) -> Learning:
        return self._learnings[resolve(ref, self._learnings, "learning")]

    def _scoped(
        self,
        tenant: str | None,
        role: str | None,
        status: LearningStatus | None,
        kind: LearningKind | None = None,
        tier: Tier | None = None,
    ) -> list[Learning]:
        return [
            x
            for x in reversed(self._learnings.values())
            if (tenant is None or x.tenant == tenant)
            and (role is None or x.role == role)
            and (status is None or x.status is status)
            and (kind is None or x.kind is kind)
            and (tier is None or x.tier is tier)
        ]

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
        scoped = self._scoped(tenant, role, status, kind, tier)
        return [x for x in scoped if ref is None or matches(ref, x.id)][:limit]

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
        scoped = self._scoped(tenant, role, status, kind, tier)
        if not terms:
            return scoped[:limit]
        hits = []
        for order, x in enumerate(scoped):
            text = f"{x.title}\n{x.body}".lower()
            n = sum(1 for t in terms if t in text)
            if n:
                hits.append((-n, order, x))
        return [x for _, _, x in sorted(hits, key=lambda h: (h[0], h[1]))][:limit]

    def _apply(self, updates: Sequence[LearningUpdate]) -> None:
        for u in updates:
            now = self._learnings.get(u.after.id)
            if now is None or now.updated_at != u.before.updated_at:
                raise StaleState(f"learning {u.after.id} changed meanwhile")
        for u in updates:
            now = self._learnings[u.after.id]
            self._learnings[u.after.id] = u.after.with_(
                title=now.title, body=now.body, citations=now.citations
            )
            self._history(u.change)

    async def update_learnings(self, updates: Sequence[LearningUpdate]) -> None:
        self._apply(updates)

    async def learning_history(self, learning_id: str) -> list[LearningChange]:
        return [c for c in self._learning_events if c.learning_id == learning_id]

    async def record_injection(self, run: KnowledgeRun, citations: Sequence[Citation]) -> None:
        self._knowledge_runs[run.job_id] = run
        for c in citations:
            key = (c.job_id, c.attempt, c.learning_id)
            if key in self._citations:
                continue
            self._citations[key] = c
            if (x := self._learnings.get(c.learning_id)) is not None:
                self._learnings[x.id] = x.with_(citations=x.citations + 1)

    async def citations(
        self, *, job_id: str | None = None, learning_id: str | None = None
    ) -> list[Citation]:
        found = [
            c
            for c in self._citations.values()
            if (job_id is None or c.job_id == job_id)
            and (learning_id is None or c.learning_id == learning_id)
        ]
        return sorted(found, key=lambda c: (c.at, c.job_id, c.attempt, c.rank))

    async def settle_run(
        self,
        job_id: str,
        *,
        succeeded: bool,
        tool_calls: int,
        reward: float | None,
        updates: Sequence[LearningUpdate],
    ) -> None:
        self._apply(updates)  # first: a stale update changes nothing
        run = self._knowledge_runs.get(job_id)
        if run is not None:
            self._knowledge_runs[job_id] = replace(run, succeeded=succeeded, tool_calls=tool_calls)
        if reward is not None:
            for key, c in self._citations.items():
                if c.job_id == job_id and c.reward is None:
                    self._citations[key] = replace(c, reward=reward)

    async def mark_settle_due(self, job_ids: Sequence[str], at: float) -> None:
        for job_id in job_ids:
            self._knowledge_due[job_id] = at

    async def settle_due(self, before: float, limit: int) -> list[str]:
        due = sorted((at, job_id) for job_id, at in self._knowledge_due.items() if at < before)
        return [job_id for _, job_id in due[:limit]]

    async def settled(self, job_id: str) -> None:
        self._knowledge_due.pop(job_id, None)

    async def knowledge_stats(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> list[ArmStats]:
        groups: dict[tuple[str, Arm], list[KnowledgeRun]] = {}
        for run in self._knowledge_runs.values():
            if run.succeeded is None:
                continue
            if (tenant is not None and run.tenant != tenant) or (
                role is not None and run.role != role
            ):
                continue
            groups.setdefault((run.role, run.arm), []).append(run)
        return [
            ArmStats(
                role=r,
                arm=arm,
                runs=len(runs),
                succeeded=sum(1 for x in runs if x.succeeded),
                tool_calls=sum(x.tool_calls or 0 for x in runs),
            )
            for (r, arm), runs in sorted(groups.items())
        ]

    async def learning_counts(
        self, *, tenant: str | None = None, role: str | None = None
    ) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for x in self._scoped(tenant, role, None):
            key = (x.role, x.status.value)
            counts[key] = counts.get(key, 0) + 1
        return counts
