"""The anomaly detector's baselines over SQL (mixed into SqlStore, migration 0021): one row per
(role, job kind, metric), its samples a JSON array rewritten in the write transaction that adds
to it, so two engines adding at once both land."""

from __future__ import annotations

import json
from collections.abc import Sequence

from corral.domain.models import Baseline
from corral.store.driver import Driver


class SqlBaselines:
    """Mixed into SqlStore."""

    driver: Driver

    async def add_baseline_samples(
        self, samples: Sequence[tuple[str, str, str, float]], *, now: float, window: int
    ) -> None:
        grouped: dict[tuple[str, str, str], list[float]] = {}
        for role, kind, metric, value in samples:
            grouped.setdefault((role, kind, metric), []).append(float(value))
        if not grouped:
            return
        async with self.driver.write() as tx:
            for (role, kind, metric), values in sorted(grouped.items()):
                row = await tx.fetchone(
                    "SELECT samples FROM world_baselines"
                    " WHERE role = ? AND kind = ? AND metric = ?",
                    (role, kind, metric),
                )
                if row is None:
                    await tx.execute(
                        "INSERT INTO world_baselines (role, kind, metric, samples, updated_at)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (role, kind, metric, json.dumps(values[-window:]), now),
                    )
                    continue
                kept = [*json.loads(row["samples"]), *values][-window:]
                await tx.execute(
                    "UPDATE world_baselines SET samples = ?, updated_at = ?"
                    " WHERE role = ? AND kind = ? AND metric = ?",
                    (json.dumps(kept), now, role, kind, metric),
                )

    async def baselines(self) -> list[Baseline]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT role, kind, metric, samples, updated_at FROM world_baselines"
                " ORDER BY role, kind, metric"
            )
        return [
            Baseline(
                role=r["role"],
                kind=r["kind"],
                metric=r["metric"],
                samples=tuple(float(v) for v in json.loads(r["samples"])),
                updated_at=float(r["updated_at"]),
            )
            for r in rows
        ]
