"""`corral config show`: the configuration the engine runs, as it recorded it when it started
(services/configs.py), and whether the local file is the same. `corral config check`: every
problem of a configuration file, one a line. `corral init`: a commented starter file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from corral.domain.errors import ConfigError, CorralError
from corral.services.configs import check_config, config_view, init_config

from .edge import config_or_fail, emit, with_store
from .exits import exit_code, fail
from .options import ConfigOpt, DataDir, JsonOpt
from .views import ts


def register(app: typer.Typer) -> None:
    """Add `corral config show|check` and `corral init` to the `corral` app."""
    group = typer.Typer(no_args_is_help=True, help="The configuration the engine runs.")
    app.add_typer(group, name="config")

    @app.command("init")
    def init(
        directory: Annotated[
            Path, typer.Argument(help="Where to write corral.yaml (default: here).")
        ] = Path("."),
        force: Annotated[
            bool, typer.Option("--force", help="Write over a corral.yaml already there.")
        ] = False,
    ) -> None:
        """Write a commented starter corral.yaml (roles, environments, guardrails) to edit."""
        try:
            written = init_config(directory, force=force)
        except CorralError as err:
            fail(err)
        typer.echo(f"wrote {written}; check it with: corral config check --config {written}")

    @group.command("check")
    def check(as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None) -> None:
        """Validate a configuration fully and list every problem, one a line: unknown keys
        (with their path), worker kinds that do not exist, names that point nowhere, values out
        of range. Exits 2 when there is any."""
        try:
            found = check_config(data_dir, config)
        except CorralError as err:
            fail(err)
        if as_json:
            emit({"source": found.source, "ok": found.ok, "problems": found.problems})
        elif found.ok:
            typer.echo(f"{found.source or 'the built-in defaults'}: no problems")
        else:
            n = len(found.problems)
            typer.echo(f"{found.source}: {n} problem{'s' if n != 1 else ''}")
            for problem in found.problems:
                typer.echo(f"  {_printable(problem)}")
        if not found.ok:
            raise typer.Exit(exit_code(ConfigError("")))

    @group.command("show")
    def show(as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None) -> None:
        """Print the configuration the engine serving this store started with (secrets
        redacted), or the local one when no engine has recorded its own; says whether the
        local file is the same."""
        local = config_or_fail(data_dir, config)
        view = with_store(local, lambda st: config_view(st, local))
        active = view.active
        info = {
            "active": active is not None,
            "engine": active.engine_id if active else None,
            "since": ts(active.at) if active else None,
            "source": active.source if active else view.local_source,
            "hash": active.hash if active else view.local_hash,
            "text": view.text,
            "local": {"source": view.local_source, "hash": view.local_hash, "same": view.same},
        }
        if as_json:
            emit(info)
            return
        typer.echo(_header(info), nl=False)
        typer.echo(view.text, nl=not view.text.endswith("\n"))


def _printable(text: str) -> str:
    """A key of the file as written may hold control characters: shown escaped, not run by
    the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _header(info: dict[str, Any]) -> str:
    source = info["source"] or "the built-in defaults"
    if not info["active"]:
        return (
            f"# no engine has recorded its configuration in this store yet: the local one,"
            f" {source} (config {info['hash'][:8]})\n"
        )
    lines = [
        f"# the configuration engine {info['engine']} runs, since {info['since']}: "
        f"{source} (config {info['hash'][:8]}), secret values redacted"
    ]
    local = info["local"]
    if not local["same"]:
        lines.append(
            f"# differs from the local {local['source'] or 'built-in defaults'} "
            f"(config {local['hash'][:8]}): commands check against this one"
        )
    return "\n".join(lines) + "\n"
