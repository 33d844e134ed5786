"""`corral config show`: the configuration the engine runs, as it recorded it when it started
(runtime/published.py), and whether the local file is the same."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import typer

from corral.config import Config
from corral.core.ports import EngineConfig, Store
from corral.runtime.published import fingerprint, redacted

from .options import ConfigOpt, DataDir, JsonOpt
from .views import ts

ConfigOf = Callable[[Path | None, Path | None], Config]
WithStore = Callable[[Config, Callable[[Store], Awaitable[Any]]], Any]
Emit = Callable[[Any], None]


def register(app: typer.Typer, config_of: ConfigOf, with_store: WithStore, emit: Emit) -> None:
    """Add `corral config show` to the `corral` app."""
    group = typer.Typer(no_args_is_help=True, help="The configuration the engine runs.")
    app.add_typer(group, name="config")

    @group.command("show")
    def show(as_json: JsonOpt = False, data_dir: DataDir = None,
             config: ConfigOpt = None) -> None:
        """Print the configuration the engine serving this store started with (secrets
        redacted), or the local one when no engine has recorded its own; says whether the
        local file is the same."""
        local = config_of(data_dir, config)
        active: EngineConfig | None = with_store(local, lambda st: st.active_config())
        mine_text = redacted(local.text)
        mine = fingerprint(mine_text)
        text = active.text if active else mine_text
        info = {"active": active is not None, "engine": active.engine_id if active else None,
                "since": ts(active.at) if active else None,
                "source": (active.source if active else
                           str(local.source) if local.source else None),
                "hash": active.hash if active else mine, "text": text,
                "local": {"source": str(local.source) if local.source else None, "hash": mine,
                          "same": active is None or active.hash == mine}}
        if as_json:
            emit(info)
            return
        typer.echo(_header(info), nl=False)
        typer.echo(text, nl=not text.endswith("\n"))


def _header(info: dict[str, Any]) -> str:
    source = info["source"] or "the built-in defaults"
    if not info["active"]:
        return (f"# no engine has recorded its configuration in this store yet: the local one,"
                f" {source} (config {info['hash'][:8]})\n")
    lines = [f"# the configuration engine {info['engine']} runs, since {info['since']}: "
             f"{source} (config {info['hash'][:8]}), secret values redacted"]
    local = info["local"]
    if not local["same"]:
        lines.append(f"# differs from the local {local['source'] or 'built-in defaults'} "
                     f"(config {local['hash'][:8]}): commands check against this one")
    return "\n".join(lines) + "\n"
