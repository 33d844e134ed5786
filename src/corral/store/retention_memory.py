"""Retention in memory (mixed into MemoryStore): the same choices as store/retention_sql.py over
the store's dictionaries. What the metrics count of a removed job stays in `_gone` (its tallies)
and `_gone_attempts` (its attempts' observations), read back by store/metrics_memory.py."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from corral.core.ports import (
    ARCHIVED_CHAINS,
    TOOL_CALL_STAGES,
    ArchiveRecord,
    ChainHead,
    GcBatch,
)
from corral.domain.agents import AgentEvent, Checkpoint
from corral.domain.errors import Conflict
from corral.domain.models import Attempt, Job, JobEvent
from corral.domain.settings import RetentionSpec
from corral.domain.states import JobState
from corral.store.retention import (
    GONE_JOBS,
    GONE_TOKENS_IN,
    GONE_TOKENS_OUT,
    GONE_TOOLS,
    label,
    segments_of,
)

Row = dict[str, Any]


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _row(value: Any) -> Row:
    """A value as a JSON-shaped row (what the archive file holds of it)."""
    plain = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
    out: Row = json.loads(json.dumps(plain, default=_plain))
    return out


class MemoryRetention:
    """Mixed into MemoryStore."""

    _jobs: dict[str, Job]
    _attempts: dict[str, Attempt]
    _job_attempts: dict[str, tuple[str, ...]]
    _agent_events: dict[tuple[str, int], AgentEvent]
    _checkpoints: list[Checkpoint]
    _ws_waits: dict[str, tuple[str, float, float | None]]
    _events: dict[str, list[tuple[int, JobEvent]]]
    _chains: dict[str, list[dict[str, Any]]]
    _heads: dict[str, ChainHead]
    _cursors: dict[tuple[str, str], Any]

    def _init_retention(self) -> None:
        self._archived: dict[str, ChainHead] = {}
        self._archives: list[ArchiveRecord] = []
        self._gone: dict[tuple[str, str], list[float]] = {}  # (series, labels) → [n, total]
        # (role, attempt index, started, ended, submitted) of removed jobs' attempts
        self._gone_attempts: list[tuple[str, int, float | None, float | None, float]] = []
        self._gc_lease: tuple[str, float] | None = None

    def _eligible(self, job: Job) -> bool:
        if not job.state.terminal:
            return False
        if job.state is JobState.DEAD_LETTERED and job.dlq_resolution is None:
            return False
        if job.id not in {r["job_id"] for r in self._chains["run_reports"]}:
            return False
        parent = self._jobs.get(job.parent_id) if job.parent_id else None
        return parent is None or parent.state.terminal

    async def gc_candidates(self, retention: RetentionSpec, *, now: float, limit: int) -> list[str]:
        found: list[tuple[float, str]] = []
        terminal = [j for j in self._jobs.values() if j.state.terminal]
        for role in sorted({j.role for j in terminal}):
            keep = retention.keep(role)
            mine = sorted(
                (j for j in terminal if j.role == role),
                key=lambda j: (j.updated_at, j.id),
                reverse=True,
            )
            newest = {j.id for j in mine[: keep.keep_jobs]}
            before = now - keep.keep_days * 86400.0
            found += [
                (j.created_at, j.id)
                for j in mine
                if self._eligible(j) and (j.updated_at < before or j.id not in newest)
            ]
        return [job_id for _, job_id in sorted(found)[:limit]]

    async def gc_collect(self, job_ids: Sequence[str], *, sinks: Sequence[str]) -> GcBatch:
        going = set(job_ids) & set(self._jobs)
        base = {t: self._archived.get(t, ChainHead(0, "")) for t in ARCHIVED_CHAINS}
        limit = {}
        for table in ARCHIVED_CHAINS:
            tip = self._heads[table].seq if table in self._heads else 0
            drained = [
                self._cursors[(s, table)].last_id if (s, table) in self._cursors else 0
                for s in sinks
            ]
            limit[table] = min([tip, *drained])
        cuts = dict.fromkeys(ARCHIVED_CHAINS, 0)
        while True:
            for table in ARCHIVED_CHAINS:
                after = [r for r in self._chains[table] if int(r["seq"]) > base[table].seq]
                first = min(
                    (
                        int(r["seq"])
                        for r in after
                        if r["job_id"] not in going and r["job_id"] in self._jobs
                    ),
                    default=None,
                )
                cut = limit[table] if first is None else min(limit[table], first - 1)
                cuts[table] = max(cut, base[table].seq)
            late = {
                str(r["job_id"])
                for table in ARCHIVED_CHAINS
                for r in self._chains[table]
                if r["job_id"] in going and int(r["seq"]) > cuts[table]
            }
            if not late:
                break
            going -= late
        ids = sorted(going)
        attempts = [self._attempts[a] for j in ids for a in self._job_attempts.get(j, ())]
        rows: dict[str, tuple[Mapping[str, Any], ...]] = {
            "jobs": tuple(_row(self._jobs[j]) for j in ids),
            "attempts": tuple(_row(a) for a in attempts),
            "agent_events": tuple(
                _row(e) for (j, _), e in sorted(self._agent_events.items()) if j in going
            ),
            "checkpoints": tuple(_row(c) for c in self._checkpoints if c.job_id in going),
        }
        for table in ARCHIVED_CHAINS:
            rows[table] = tuple(
                dict(r)
                for r in self._chains[table]
                if base[table].seq < int(r["seq"]) <= cuts[table]
            )
        return GcBatch(
            jobs=tuple(ids),
            rows=rows,
            segments=segments_of(rows, base),
            dirs=tuple(sorted({a.dir for a in attempts if a.dir})),
            held=len(set(job_ids)) - len(ids),
        )

    def _keep(self, series: str, key: str, n: float, total: float = 0.0) -> None:
        entry = self._gone.setdefault((series, key), [0.0, 0.0])
        entry[0] += n
        entry[1] += total

    def _keep_figures(self, jobs: Sequence[Job], batch: GcBatch) -> None:
        """What the metrics count of these jobs, kept before they go."""
        going = {j.id for j in jobs}
        for job in jobs:
            self._keep(GONE_JOBS, label(job.role, job.env_name, job.priority, job.state.value), 1)
            for aid in self._job_attempts.get(job.id, ()):
                a = self._attempts[aid]
                self._gone_attempts.append(
                    (job.role, a.index, a.started_at, a.ended_at, job.created_at)
                )
        for (job_id, _), e in list(self._agent_events.items()):
            owner = self._jobs.get(job_id)
            if job_id in going and owner is not None:
                key = label(owner.role, owner.tenant, owner.worker)
                self._keep(GONE_TOKENS_IN, key, e.tokens_in, e.cost_usd or 0.0)
                self._keep(GONE_TOKENS_OUT, key, e.tokens_out)
        before, after = batch.segments["policy_evaluations"]
        for r in self._chains["policy_evaluations"]:
            if (
                before.seq < int(r["seq"]) <= after.seq
                and r["stage"] in TOOL_CALL_STAGES
                and not (r["stage"] == "guardrail" and r["subject"] == "spawn")
            ):
                self._keep(GONE_TOOLS, label(r["verdict"], r["reason"]), 1)

    async def gc_remove(
        self, batch: GcBatch, *, archive: str, now: float, bounds: Sequence[float]
    ) -> int:
        for table, (before, _) in batch.segments.items():
            if self._archived.get(table, ChainHead(0, "")).seq != before.seq:
                raise Conflict(
                    f"the archived part of {table} moved since this batch was read: try again"
                )
        jobs = [self._jobs.get(j) for j in batch.jobs]
        if any(j is None or not j.state.terminal for j in jobs):
            raise Conflict("a job of this batch is gone or not terminal: try again")
        self._keep_figures([j for j in jobs if j is not None], batch)
        going = set(batch.jobs)
        drop: Callable[[str], bool] = going.__contains__
        for job_id in batch.jobs:
            for aid in self._job_attempts.pop(job_id, ()):
                self._attempts.pop(aid, None)
            self._jobs.pop(job_id, None)
            self._ws_waits.pop(job_id, None)
            self._events.pop(job_id, None)
        self._agent_events = {k: e for k, e in self._agent_events.items() if not drop(k[0])}
        self._checkpoints[:] = [c for c in self._checkpoints if not drop(c.job_id)]
        for table, (seg_from, seg_to) in batch.segments.items():
            self._chains[table] = [
                r for r in self._chains[table] if not seg_from.seq < int(r["seq"]) <= seg_to.seq
            ]
            self._archived[table] = seg_to
        self._archives.append(
            ArchiveRecord(
                id=len(self._archives) + 1,
                at=now,
                file=archive,
                jobs=len(batch.jobs),
                segments=dict(batch.segments),
            )
        )
        return len(batch.jobs)

    async def gc_known(self, job_ids: Sequence[str]) -> set[str]:
        return {j for j in job_ids if j in self._jobs}

    async def archived_heads(self) -> dict[str, ChainHead]:
        return dict(self._archived)

    async def archives(self) -> list[ArchiveRecord]:
        return list(self._archives)

    async def claim_gc(self, holder: str, *, now: float, lease_s: float) -> bool:
        if self._gc_lease and self._gc_lease[0] != holder and self._gc_lease[1] >= now:
            return False
        self._gc_lease = (holder, now + lease_s)
        return True

    async def release_gc(self, holder: str) -> None:
        if self._gc_lease and self._gc_lease[0] == holder:
            self._gc_lease = None
