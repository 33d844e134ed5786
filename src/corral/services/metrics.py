"""The Prometheus exposition of a data directory (trace/metrics.py): the store's figures and the
core's live state of the engine serving it (none when no engine runs: `corral_engine_up 0`).
`corral metrics` prints `exposition`, and the HTTP API serves it at GET /metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from corral.config import Config
from corral.services import clusters, engine
from corral.trace import metrics
from corral.trace.metrics import MetricsSource


def core_state(data_dir: Path) -> metrics.Snapshot:
    """The engine's core snapshot, asked at each scrape (raises when no engine answers)."""

    def read() -> Mapping[str, Any]:
        return engine.snapshot(data_dir)

    return read


async def exposition(store: MetricsSource, config: Config) -> bytes:
    """The metrics in Prometheus text format, read now: the event sinks' backlogs of the sinks
    `config` names, and each Ray environment's cluster health."""
    health = None
    if any(e.kind == "ray" for e in config.settings.environments.values()):

        def health() -> list[dict[str, Any]]:
            return [asdict(h) for h in clusters.clusters(config)]

    return await metrics.exposition(
        store,
        core_state(config.data_dir),
        sinks=[s.name for s in config.settings.events.sinks],
        clusters=health,
    )
