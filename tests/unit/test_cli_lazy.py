"""The command modules load when one of their commands runs (cli/lazy.py): a short command does
not import what the others need, and `--help` still lists every command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from corral.cli import Commands, app

# What `corral jobs --json` on an empty store must not import: the other command modules, the
# engine, the guardrails and the schema models (nothing to dump).
NOT_FOR_JOBS = (
    "corral.cli.governance",
    "corral.cli.guard",
    "corral.cli.policy_cmds",
    "corral.cli.world",
    "corral.cli.waiting",
    "corral.runtime.engine",
    "corral.policy.guardrails",
    "corral.schemas.views",
    "corral.services.submissions",
)

PROBE = """
import json, sys
sys.argv = ["corral", "jobs", "--json", "--data-dir", sys.argv[1]]
from corral.main import main
try:
    main()
except SystemExit as end:
    code = end.code
# a module behind importlib's LazyLoader that nothing touched was never executed
ran = sorted(n for n, m in sys.modules.items() if type(m).__name__ != "_LazyModule")
sys.stderr.write("\\n" + json.dumps({"code": code, "modules": ran}) + "\\n")
"""


def test_jobs_on_an_empty_store_imports_only_what_it_uses(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    probe = json.loads(r.stderr.strip().splitlines()[-1])
    assert probe["code"] == 0 and json.loads(r.stdout) == []
    assert "corral.cli.jobs" in probe["modules"]
    assert [m for m in NOT_FOR_JOBS if m in probe["modules"]] == []


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
