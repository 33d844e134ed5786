"""The anomaly detector's baselines in memory, with the semantics of store/world_sql.py."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.models import Baseline


class MemoryBaselines:
    """Mixed into MemoryStore."""

    _baselines: dict[tuple[str, str, str], Baseline]

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
