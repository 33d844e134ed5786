"""The world model's reads and the anomaly detector's baselines in memory, with the semantics
of store/world_sql.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.domain.agents import Checkpoint
from corral.domain.models import Attempt, AttemptSketch, Baseline, Job, JobEvent, JobSketch
from corral.domain.states import JobState

WAIT_KINDS = ("wait_started", "wait_ended")
WAITING = frozenset({JobState.QUEUED, JobState.RETRY_WAIT})
NEVER_QUEUED = frozenset({JobState.DENIED, JobState.AWAITING_APPROVAL, JobState.SUBMITTED})


def _sketch(j: Job, workflow: str | None = None) -> JobSketch:
    return JobSketch(
        id=j.id,
        state=j.state,
        role=j.role,
        worker=j.worker,
        env_name=j.env_name,
        tenant=j.tenant,
        parent_id=j.parent_id,
        after=j.after,
        deps_pending=j.deps_pending,
        exit_code=j.exit_code,
        workflow=workflow,
    )


class MemoryWorld:
    """Mixed into MemoryStore."""

    _baselines: dict[tuple[str, str, str], Baseline]
    _jobs: dict[str, Job]
    _checkpoints: list[Checkpoint]
    _events: dict[str, list[tuple[int, JobEvent]]]

    _attempts: dict[str, Attempt]

    if TYPE_CHECKING:  # MemoryStore's

        async def inflight(self) -> list[tuple[Job, Attempt]]: ...

        def _rows(self, table: str) -> Iterator[Mapping[str, Any]]: ...

    async def world_jobs(self, *, finished: int) -> list[JobSketch]:
        live = [
            j
            for j in self._jobs.values()
            if not j.state.terminal
            and not j.state.in_flight
            and (j.state not in WAITING or j.parent_id is not None or j.deps_pending > 0)
        ]
        ended = sorted(
            (j for j in self._jobs.values() if j.state.terminal), key=lambda j: j.id, reverse=True
        )[:finished]
        return [_sketch(j) for j in (*live, *ended)]

    async def world_inflight(self) -> list[tuple[JobSketch, AttemptSketch]]:
        return [
            (
                _sketch(j, j.options.workflow),
                AttemptSketch(index=a.index, started_at=a.started_at),
            )
            for j, a in await self.inflight()
        ]

    async def world_queues(self, *, tenant: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self._jobs.values():
            if j.state in WAITING and tenant in (None, j.tenant):
                out[j.env_name] = out.get(j.env_name, 0) + 1
        return out

    async def world_sketches(self, job_ids: Sequence[str]) -> list[JobSketch]:
        return [
            _sketch(j)
            for i in dict.fromkeys(job_ids)
            if (j := self._jobs.get(i)) is not None and not j.state.terminal
        ]

    async def queue_reading(
        self, env: str, *, since: float
    ) -> tuple[int, list[float], list[float]]:
        jobs = [j for j in self._jobs.values() if j.env_name == env]
        depth = sum(1 for j in jobs if j.state in WAITING)
        arrived = [
            j.created_at for j in jobs if j.created_at >= since and j.state not in NEVER_QUEUED
        ]
        ids = {j.id for j in jobs}
        started = [
            a.created_at
            for a in self._attempts.values()
            if a.job_id in ids and a.created_at >= since
        ]
        return depth, sorted(arrived), sorted(started)

    async def throttle_state(self, subject: str) -> bool:
        for r in reversed(list(self._rows("policy_evaluations"))):
            if (
                r["stage"] == "throttle"
                and r["subject"] == subject
                and r["reason"]
                in (
                    "throttled",
                    "still_throttled",
                    "released",
                )
            ):
                return bool(r["reason"] != "released")
        return False

    async def world_records(
        self, job_ids: Sequence[str]
    ) -> tuple[dict[str, Checkpoint], list[JobEvent]]:
        wanted = set(job_ids)
        latest = {c.job_id: c for c in self._checkpoints if c.job_id in wanted}
        events = sorted(
            (seq, e)
            for job_id in wanted
            for seq, e in self._events.get(job_id, [])
            if e.kind in WAIT_KINDS
        )
        return latest, [e for _, e in events]

    async def add_baseline_samples(
        self, samples: Sequence[tuple[str, str, str, float]], *, now: float, window: int
    ) -> None:
        for role, kind, metric, value in samples:
            key = (role, kind, metric)
            old = self._baselines.get(key)
            kept = (*(old.samples if old else ()), float(value))[-window:]
            self._baselines[key] = Baseline(
                role=role, kind=kind, metric=metric, samples=kept, updated_at=now
            )

    async def baselines(self) -> list[Baseline]:
        return [self._baselines[k] for k in sorted(self._baselines)]
