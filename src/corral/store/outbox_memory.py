"""The outbox in memory (core/ports.py OutboxReads): the chained tables' rows past a cursor, and
the cursors themselves, deciding alike with the SQL stores (store/outbox_sql.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from corral.core.ports import EventCursor
from corral.domain.agents import AgentEvent
from corral.store.outbox import lease_blocked, outbox_table


class MemoryOutbox:
    """Mixed into MemoryStore; `_chains` is the chained tables' rows (governance_memory.py)."""

    _chains: dict[str, list[dict[str, Any]]]
    _cursors: dict[tuple[str, str], EventCursor]
    _agent_events: dict[tuple[str, int], AgentEvent]

    async def outbox_rows(self, source: str, *, after: int, limit: int) -> list[Mapping[str, Any]]:
        rows = self._chains[outbox_table(source)]
        out: list[Mapping[str, Any]] = [
            dict(r) for r in rows if r.get("seq") is not None and r["seq"] > after
        ]
        return out[:limit]

    async def outbox_tip(self, source: str) -> int:
        rows = self._chains[outbox_table(source)]
        return max((int(r["seq"]) for r in rows if r.get("seq") is not None), default=0)

    async def outbox_agent_events(self, job_ids: Sequence[str]) -> list[AgentEvent]:
        wanted = set(job_ids)
        return [self._agent_events[k] for k in sorted(self._agent_events) if k[0] in wanted]

    async def claim_cursors(
        self, sink: str, sources: Sequence[str], *, holder: str, now: float, lease_s: float
    ) -> list[EventCursor] | None:
        archived: dict[str, Any] = getattr(self, "_archived", {})
        for source in sources:
            start = archived[source].seq if source in archived else 0  # after what retention took
            self._cursors.setdefault(
                (sink, outbox_table(source)), EventCursor(sink=sink, source=source, last_id=start)
            )
        mine = [k for k in self._cursors if k[0] == sink]
        if lease_blocked([self._cursors[k] for k in mine], holder, now):
            return None
        for k in mine:
            self._cursors[k] = dataclasses.replace(
                self._cursors[k], holder=holder, lease_until=now + lease_s
            )
        return [self._cursors[k] for k in sorted(mine) if k[1] in sources]

    async def advance_cursor(
        self, sink: str, source: str, *, holder: str, last_id: int, skipped: int = 0, now: float
    ) -> bool:
        cursor = self._cursors.get((sink, source))
        if cursor is None or cursor.holder != holder or cursor.last_id > last_id:
            return False
        self._cursors[(sink, source)] = dataclasses.replace(
            cursor, last_id=last_id, skipped=cursor.skipped + skipped
        )
        return True

    async def event_cursors(self) -> list[EventCursor]:
        return [self._cursors[k] for k in sorted(self._cursors)]
