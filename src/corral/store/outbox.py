"""What the memory and SQL outboxes (store/outbox_memory.py, store/outbox_sql.py) decide alike:
which tables are an outbox, and when a sink's lease belongs to another engine."""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.ports import EventCursor
from corral.store.chain import CHAINS


def outbox_table(source: str) -> str:
    """`source` checked against the chained tables (it is written into SQL)."""
    if source not in CHAINS:
        raise ValueError(f"not an outbox table: {source!r}")
    return source


def lease_blocked(cursors: Sequence[EventCursor], holder: str, now: float) -> bool:
    """Whether another holder's lease on any of the sink's cursors is still running."""
    return any(
        c.holder is not None
        and c.holder != holder
        and c.lease_until is not None
        and c.lease_until >= now
        for c in cursors
    )
