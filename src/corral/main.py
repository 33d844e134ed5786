"""The `corral` command with every edge wired in: the CLI (cli/) and, inside `corral serve`,
the HTTP API (api/) with the dashboard (ui/) mounted at /ui. The edges are independent rooms
(pyproject.toml's import-linter layers); this module, above them, is where they meet."""

from __future__ import annotations

from typing import Any

from corral import codecache

codecache.install()  # before the CLI's modules create their dataclasses (codecache.py)

from corral import cli  # noqa: E402


def listen(address: str, **options: Any) -> Any:
    """The HTTP API's `listen` (api/server.py), imported only when `corral serve` binds an
    address: FastAPI, uvicorn and the engine are not what a short command should load."""
    from functools import partial

    from corral import ui
    from corral.api.server import listen as bind

    tls = options.get("tls_cert") is not None
    return bind(address, ui=partial(ui.mount, secure=tls), **options)


def main() -> None:
    """Entry point of the `corral` command."""
    cli.main(http=listen)
