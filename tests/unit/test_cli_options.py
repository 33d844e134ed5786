"""The options every `corral` command takes sit on the app's one callback: typer keeps only the
last callback registered, so a second one silently dropped `--url` (the remote CLI) when
`--version` was added."""

from __future__ import annotations

import typer

from corral.cli import app


def test_the_app_takes_url_and_version_before_any_command() -> None:
    top = typer.main.get_command(app)
    assert {"--url", "--version"} <= {opt for p in top.params for opt in p.opts}
