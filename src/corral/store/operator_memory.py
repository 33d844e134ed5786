"""What the operator's commands read and the engine publishes for them, in memory, with the
semantics of store/operator_sql.py."""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.ports import EngineConfig
from corral.domain.ids import shortest
from corral.domain.models import Job
from corral.domain.states import JobState


class MemoryOperator:
    """Mixed into MemoryStore."""

    _jobs: dict[str, Job]
    _engines: dict[str, tuple[str, int, float, float]]  # id → (host, pid, started, heartbeat)
    _configs: list[EngineConfig]

    async def short_ids(self, ids: Sequence[str]) -> dict[str, str]:
        return shortest(ids, self._jobs)

    async def queued_ahead(self, job: Job) -> int:
        return sum(
            1
            for j in self._jobs.values()
            if j.state is JobState.QUEUED
            and j.deps_pending == 0
            and (j.sort_at, j.id) < (job.sort_at, job.id)
        )

    async def live_engines(self, *, since: float) -> list[str]:
        return sorted(e for e, (_, _, _, beat) in self._engines.items() if beat >= since)

    async def publish_config(self, config: EngineConfig) -> None:
        self._configs.append(config)

    async def active_config(self) -> EngineConfig | None:
        if not self._configs:
            return None
        return max(reversed(self._configs), key=lambda c: c.at)
