"""What every `corral` command shares as an edge over the services (services/): the
configuration, one store per command, JSON for scripts, a poke to the engine, and every
CorralError turned into one line on stderr with its exit code (cli/exits.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from corral.domain.errors import CorralError
from corral.workers import privacy

from .exits import fail as fail  # re-exported: the command modules import it from here

if TYPE_CHECKING:  # imported where used: a command pays only for what it runs
    from corral.client import AsyncClient
    from corral.config import Config
    from corral.core.jobquery import JobQuery
    from corral.core.ports import Store
    from corral.domain.models import Job
    from corral.services import Wake

T = TypeVar("T")
_remote: list[str] = []  # the engine's URL given with --url / CORRAL_URL, when one is


def set_remote(url: str | None) -> None:
    """The commands that can go through a remote engine's HTTP API do from now on."""
    _remote.clear()
    if url:
        _remote.append(url)


def remote_url() -> str | None:
    """The remote engine's URL (`corral --url`, `CORRAL_URL`), or None: work locally."""
    return _remote[0] if _remote else None


def through_api(call: Callable[[AsyncClient], Awaitable[T]]) -> T | None:
    """With `--url`: the remote engine's answer to `call` (cli/remote.py: an error answer
    ends the command); None: work locally."""
    if (url := remote_url()) is None:
        return None
    from . import remote  # with its client: only when a URL is given

    return remote.run(url, call)


def load_config(data_dir: Path | None, config: Path | None) -> Config:
    from corral.config import load

    cfg = load(data_dir=data_dir, config_path=config)
    # Private from its first file on, whichever command creates it (workers/privacy.py).
    warning = privacy.secure_data_dir(cfg.data_dir)
    if warning:
        typer.echo(f"corral: warning: {warning}", err=True)
    return cfg


def config_or_fail(data_dir: Path | None, config: Path | None) -> Config:
    try:
        return load_config(data_dir, config)
    except CorralError as err:
        fail(err)


def peek_jobs(data_dir: Path | None, config: Path | None, query: JobQuery) -> list[Job] | None:
    """The jobs `query` selects, read from the SQLite file without loading the configuration
    or opening the store: when no configuration file is found and no store URL is set, every
    setting is the built-in default, so there is nothing to validate (store/peek.py). None:
    load the configuration and open the store (config_or_fail, with_store)."""
    from corral.config_paths import DB_NAME, SQLITE_BUSY_TIMEOUT_MS, data_dir_of, find_config
    from corral.store import peek

    try:  # what load_config does first, with the same errors
        ddir = data_dir_of(data_dir)
        if os.environ.get("CORRAL_STORE_URL") or find_config(config, ddir) is not None:
            return None
        warning = privacy.secure_data_dir(ddir)
    except CorralError as err:
        fail(err)
    if warning:  # said once: a second look finds nothing left to narrow
        typer.echo(f"corral: warning: {warning}", err=True)
    return peek.list_jobs(ddir / DB_NAME, query, busy_timeout_ms=SQLITE_BUSY_TIMEOUT_MS)


def with_store(cfg: Config, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run one coroutine against it, close it; errors become one line."""
    import anyio

    from corral.runtime.assembly import build_store

    async def main() -> T:
        store = build_store(cfg)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    try:
        return anyio.run(main)
    except CorralError as err:
        fail(err)


def emit(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def note(text: str) -> None:
    """A service's note for the operator, on stderr."""
    typer.echo(f"corral: note: {text}", err=True)


def waker(cfg: Config) -> Wake:
    """Tell the engine serving `cfg`'s data directory to look now (a no-op when none runs)."""
    from corral.runtime import control

    return control.waker(cfg.data_dir)
