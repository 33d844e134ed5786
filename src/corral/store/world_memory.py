"""The world model's reads and the anomaly detector's baselines in memory, with the semantics
of store/world_sql.py."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.agents import Checkpoint
from corral.domain.models import Baseline, Job, JobEvent, JobSketch

WAIT_KINDS = ("wait_started", "wait_ended")


def _sketch(j: Job) -> JobSketch:
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
    )


class MemoryWorld:
    """Mixed into MemoryStore."""

    _baselines: dict[tuple[str, str, str], Baseline]
    _jobs: dict[str, Job]
    _checkpoints: list[Checkpoint]
    _events: dict[str, list[tuple[int, JobEvent]]]

    async def world_jobs(self, *, finished: int) -> list[JobSketch]:
        live = [j for j in self._jobs.values() if not j.state.terminal]
        ended = sorted(
            (j for j in self._jobs.values() if j.state.terminal), key=lambda j: j.id, reverse=True
        )[:finished]
        return [_sketch(j) for j in (*live, *ended)]

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
