"""The audit chain as an operator sees it: verify every chain, put back the append-only
triggers (the machinery is runtime/audit.py's and the store's; docs/explanation/audit.md)."""

from __future__ import annotations

from corral.config import Config
from corral.core.ports import ArchivedAudit, AuditReport, AuditStore
from corral.runtime import audit


async def verify(store: ArchivedAudit, config: Config) -> AuditReport:
    """Every audit chain checked against the audit key and the signed checkpoints in the data
    directory (from where retention's archive ends, and the archive files that are there), and
    that every append-only trigger is in place."""
    return await audit.verify(store, config)


async def restore_triggers(store: AuditStore) -> list[str]:
    """Put back the append-only triggers that are missing or disabled; their names."""
    return await store.restore_triggers()
