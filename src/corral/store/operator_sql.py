"""What the operator's commands read and the engine publishes for them, over SQL: the short
forms of job ids, a waiting job's place in the queue, the engines alive, the configuration an
engine serves with (docs/reference/cli.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.core.ports import EngineConfig
from corral.domain.ids import SHORT_MIN
from corral.domain.models import Job
from corral.store.driver import Driver, Tx


class SqlOperator:
    """Mixed into SqlStore."""

    driver: Driver

    async def short_ids(self, ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        todo = list(dict.fromkeys(ids))
        n = SHORT_MIN
        async with self.driver.read() as tx:
            while todo:
                tails = {i: i[-n:] for i in todo}
                clashes = await _clashes(tx, tails, n)
                out.update((i, t) for i, t in tails.items() if i not in clashes or len(i) <= n)
                todo = [i for i in todo if i not in out]
                n += 1
        return out

    async def queued_ahead(self, job: Job) -> int:
        async with self.driver.read() as tx:  # the jobs_runnable index answers this
            row = await tx.fetchone(
                "SELECT COUNT(*) AS n FROM jobs WHERE state = 'QUEUED' AND deps_pending = 0"
                " AND (sort_at < ? OR (sort_at = ? AND id < ?))",
                (job.sort_at, job.sort_at, job.id),
            )
        return int(row["n"]) if row else 0

    async def live_engines(self, *, since: float) -> list[str]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT id FROM engines WHERE heartbeat_at >= ? ORDER BY id", (since,)
            )
        return [r["id"] for r in rows]

    async def publish_config(self, config: EngineConfig) -> None:
        async with self.driver.write() as tx:
            await tx.execute(
                "INSERT INTO engine_configs (engine_id, at, hash, source, text)"
                " VALUES (?, ?, ?, ?, ?)",
                (config.engine_id, config.at, config.hash, config.source, config.text),
            )

    async def active_config(self) -> EngineConfig | None:
        async with self.driver.read() as tx:
            row = await tx.fetchone(
                "SELECT engine_id, at, hash, source, text FROM "
                "engine_configs ORDER BY at DESC, id DESC LIMIT 1"
            )
        if row is None:
            return None
        return EngineConfig(
            engine_id=row["engine_id"],
            at=float(row["at"]),
            hash=row["hash"],
            source=row["source"],
            text=row["text"],
        )


async def _clashes(tx: Tx, tails: Mapping[str, str], n: int) -> set[str]:
    """The ids whose `n`-character tail also ends, or begins, another job's id."""
    values = sorted(set(tails.values()))
    found: list[str] = []
    for start in range(0, len(values), 400):
        part = values[start : start + 400]
        marks = ", ".join("?" * len(part))
        rows = await tx.fetchall(
            f"SELECT id FROM jobs WHERE substr(id, length(id) - ? + 1) IN "
            f"({marks}) OR substr(id, 1, ?) IN ({marks})",
            (n, *part, n, *part),
        )
        found += [r["id"] for r in rows]
    return {
        i
        for i, t in tails.items()
        if any(o != i and (o.endswith(t) or o.startswith(t)) for o in found)
    }
