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


async def exposition(store: MetricsSource, data_dir: Path, config: Config | None = None) -> bytes:
    """The metrics in Prometheus text format, read now (with `config`, each Ray environment's
    cluster health too)."""
    health = None
    if config is not None and any(e.kind == "ray" for e in config.settings.environments.values()):

        def health() -> list[dict[str, Any]]:
            return [asdict(h) for h in clusters.clusters(config)]

    return await metrics.exposition(store, core_state(data_dir), health)
