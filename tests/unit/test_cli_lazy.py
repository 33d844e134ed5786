"""The command modules load when one of their commands runs (cli/lazy.py), and `--help` still
lists every command; what a short command imports is tests/unit/test_cli_startup.py's."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from corral.cli import Commands, app


def test_each_lazy_name_is_what_its_module_registers() -> None:
    by_loader: dict[object, set[str]] = {}
    for name, register in Commands.lazy.items():
        by_loader.setdefault(register, set()).add(name)
    for register, names in by_loader.items():
        sub = typer.Typer(rich_markup_mode=None)
        register(sub)
        assert set(typer.main.get_group(sub).commands) == names


def test_help_lists_every_command_and_each_one_resolves() -> None:
    top = typer.main.get_command(app)
    assert isinstance(top, Commands)
    names = list(top.commands)
    assert len(names) == len(set(names)) == len(dict(top.commands.items()))
    assert set(Commands.lazy) <= set(names) and set(Commands.order) == set(names)
    out = CliRunner().invoke(app, ["--help"]).output
    for name in names:
        assert f"  {name} " in out, name


def test_a_lazy_group_command_runs_with_its_options(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["jobs", "--json", "--data-dir", str(tmp_path / "d")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == []
    bad = CliRunner().invoke(app, ["jobs", "--no-such-option"])
    assert bad.exit_code == 2
