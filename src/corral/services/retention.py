"""Retention as an operator runs it (`corral gc`): terminal jobs past `retention` archived and
removed, or (`dry_run`) listed; the machinery is runtime/retention.py's, which a running engine
also runs every `retention.interval_s` (docs/how-to/retention.md)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from corral.config import Config
from corral.core.ports import RetentionStore
from corral.runtime import retention
from corral.runtime.retention import GcProgress, GcResult

__all__ = ["GcProgress", "GcResult", "gc"]


async def gc(
    store: RetentionStore,
    config: Config,
    *,
    dry_run: bool = False,
    progress: Callable[[GcProgress], None] | None = None,
) -> GcResult:
    """Run retention once, now. Conflict when an engine (or another `corral gc`) is collecting."""
    holder = f"gc-{socket.gethostname()}-{os.getpid()}"
    return await retention.collect(store, config, holder=holder, dry_run=dry_run, progress=progress)
