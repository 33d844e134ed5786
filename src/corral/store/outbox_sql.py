"""The outbox over SQL (core/ports.py OutboxReads, trace/drain.py): the append-only tables read
past a cursor in `seq` order, and the cursors of migration 0015.

Why `seq` and not the autoincrement id: a chain position is handed out under the chain's head
lock (store/chain.py), held until the transaction ends, so rows commit in `seq` order. An
autoincrement id is not: on PostgreSQL a transaction that took id 10 may commit after one that
took 11, and a cursor already past 11 would never see 10.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from corral.core.ports import EventCursor
from corral.domain.agents import AgentEvent
from corral.store.driver import Driver, Row
from corral.store.outbox import lease_blocked, outbox_table

_CURSOR_COLUMNS = "sink, source, last_id, skipped, holder, lease_until"


def cursor_of(r: Row) -> EventCursor:
    lease = r["lease_until"]
    return EventCursor(
        sink=r["sink"],
        source=r["source"],
        last_id=int(r["last_id"]),
        skipped=int(r["skipped"]),
        holder=r["holder"],
        lease_until=float(lease) if lease is not None else None,
    )


class SqlOutbox:
    """Mixed into SqlStore."""

    driver: Driver

    async def outbox_rows(self, source: str, *, after: int, limit: int) -> list[Mapping[str, Any]]:
        table = outbox_table(source)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT * FROM {table} WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            )
        return [dict(r) for r in rows]

    async def outbox_tip(self, source: str) -> int:
        table = outbox_table(source)
        async with self.driver.read() as tx:
            row = await tx.fetchone(f"SELECT MAX(seq) AS tip FROM {table}")
        return int(row["tip"]) if row and row["tip"] is not None else 0

    async def outbox_agent_events(self, job_ids: Sequence[str]) -> list[AgentEvent]:
        wanted = sorted(set(job_ids))
        if not wanted:
            return []
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT data FROM agent_events WHERE job_id IN ({', '.join('?' * len(wanted))})"
                " ORDER BY job_id, attempt",
                wanted,
            )
        return [AgentEvent.from_dict(json.loads(r["data"])) for r in rows]

    async def claim_cursors(
        self, sink: str, sources: Sequence[str], *, holder: str, now: float, lease_s: float
    ) -> list[EventCursor] | None:
        for source in sources:
            outbox_table(source)
        # PostgreSQL: lock the sink's rows so that of two engines claiming at once the second
        # sees the first's lease (SQLite serialises every writer anyway).
        lock = " FOR UPDATE" if self.driver.dialect == "postgres" else ""
        async with self.driver.write() as tx:
            for source in sources:
                # a new sink starts after what retention archived (those rows are gone)
                await tx.execute(
                    "INSERT INTO event_cursors (sink, source, last_id, skipped, updated_at)"
                    " VALUES (?, ?, COALESCE((SELECT seq FROM archive_heads WHERE chain = ?), 0),"
                    " 0, ?) ON CONFLICT (sink, source) DO NOTHING",
                    (sink, source, source, now),
                )
            rows = await tx.fetchall(
                f"SELECT {_CURSOR_COLUMNS} FROM event_cursors WHERE sink = ? ORDER BY source{lock}",
                (sink,),
            )
            if lease_blocked([cursor_of(r) for r in rows], holder, now):
                return None
            await tx.execute(
                "UPDATE event_cursors SET holder = ?, lease_until = ? WHERE sink = ?",
                (holder, now + lease_s, sink),
            )
            rows = await tx.fetchall(
                f"SELECT {_CURSOR_COLUMNS} FROM event_cursors WHERE sink = ? ORDER BY source",
                (sink,),
            )
        return [cursor_of(r) for r in rows if r["source"] in sources]

    async def advance_cursor(
        self, sink: str, source: str, *, holder: str, last_id: int, skipped: int = 0, now: float
    ) -> bool:
        async with self.driver.write() as tx:
            n = await tx.execute(
                "UPDATE event_cursors SET last_id = ?, skipped = skipped + ?, updated_at = ?"
                " WHERE sink = ? AND source = ? AND holder = ? AND last_id <= ?",
                (last_id, skipped, now, sink, source, holder, last_id),
            )
        return n == 1

    async def event_cursors(self) -> list[EventCursor]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT {_CURSOR_COLUMNS} FROM event_cursors ORDER BY sink, source"
            )
        return [cursor_of(r) for r in rows]
