"""The `corral` command with every edge wired in: the CLI (cli/) and, inside `corral serve`,
the HTTP API (api/). The two edges are independent rooms (pyproject.toml's import-linter
layers); this module, above both, is where they meet."""

from __future__ import annotations

from corral import cli
from corral.api.server import listen


def main() -> None:
    """Entry point of the `corral` command."""
    cli.main(http=listen)
