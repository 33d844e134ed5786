"""How the parts are put together from the configuration, for every process that needs them:
the store and the worker kinds (services/submissions.py composes the submission service over
them). Kept apart from the engine so that a `corral` command that only submits or reads imports
none of the engine's machinery (start-up time is most of a short command's cost)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from corral.config import AGENT_ADAPTERS, Config
from corral.core.ports import Store
from corral.domain.errors import StoreError
from corral.workers.sealing import KeyFile


def build_store(config: Config) -> Store:
    """The store named by the configuration: PostgreSQL for a postgresql:// URL, else SQLite;
    its audit chains keyed with the data directory's audit key (store/chain.py)."""
    store = _store(config)
    store.use_audit_key(KeyFile(config.audit_key))
    return store


def _store(config: Config) -> Store:
    url = config.store_url
    if url and is_shared(config):
        from corral.store.postgres import PostgresStore

        return PostgresStore(url)
    if url and not url.startswith("sqlite:"):
        raise StoreError(f"unsupported store URL {url!r}: use postgresql://… or sqlite:///path")
    from corral.store.sqlite import SqliteStore

    path = Path(url.removeprefix("sqlite://")) if url else config.db_path
    return SqliteStore(
        path, synchronous=config.sqlite_synchronous, busy_timeout_ms=config.sqlite_busy_timeout_ms
    )


def is_shared(config: Config) -> bool:
    """Whether several engines may share the store (PostgreSQL) or one owns it (SQLite)."""
    url = config.store_url or ""
    return url.startswith(("postgresql://", "postgres://"))


def advertise(config: Config) -> None:
    """Jobs inherit where this engine lives, so a job that runs `corral submit` reaches it
    (and becomes the new job's parent through CORRAL_JOB_ID)."""
    os.environ["CORRAL_DATA_DIR"] = str(config.data_dir)
    if config.source is not None:
        os.environ["CORRAL_CONFIG"] = str(config.source)


def adapter_of(config: Config, kind: str) -> str:
    """The adapter behind a worker kind: its configured one, else the kind's own name."""
    spec = config.settings.workers.get(kind)
    return spec.adapter if spec is not None and spec.adapter else kind


def worker_kinds(config: Config) -> frozenset[str]:
    """The worker kinds this build can run (submissions naming others are refused)."""
    own = {n for n, w in config.settings.workers.items() if w.adapter}
    return frozenset({"command", *AGENT_ADAPTERS, *own})


def agent_kinds(config: Config) -> frozenset[str]:
    return frozenset(k for k in worker_kinds(config) if adapter_of(config, k) in AGENT_ADAPTERS)


def settle_heap() -> None:
    """Take what start-up allocated (modules, configuration, parsers, grammars) out of the
    collector's way: a full collection then walks only what serving allocates. Without it a
    full collection of a serving process stalls its event loop for 7–9 ms (bench/policy.py
    measures both)."""
    gc.collect()
    gc.freeze()
