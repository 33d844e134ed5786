"""The options every `corral` command takes sit on the app's one callback: typer keeps only the
last callback registered, so a second one silently dropped `--url` (the remote CLI) when
`--version` was added."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from corral.cli import app

CORRAL = str(Path(sys.executable).with_name("corral"))


def test_the_app_takes_url_and_version_before_any_command() -> None:
    top = typer.main.get_command(app)
    assert {"--url", "--version"} <= {opt for p in top.params for opt in p.opts}


@pytest.mark.parametrize(("shell", "first"), [("zsh", "#compdef corral"), ("fish", "complete")])
def test_a_shell_named_after_show_completion_is_the_one_shown(
    shell: str, first: str, tmp_path: Path
) -> None:
    """Whatever shell runs the command (bash here, or none at all in a script), the named one."""
    r = subprocess.run(
        [CORRAL, "--show-completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.lstrip().startswith(first), r.stdout[:200]


def test_install_completion_for_a_named_shell_writes_that_shells_file(tmp_path: Path) -> None:
    r = subprocess.run(
        [CORRAL, "--install-completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert "_corral_completion" in (tmp_path / ".bash_completions" / "corral.sh").read_text()
