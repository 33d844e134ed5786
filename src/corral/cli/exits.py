"""Exit codes at the CLI edge: one table from an error's machine code to the code `corral`
exits with (docs/reference/cli.md#exit-codes lists them for users).

The domain's errors say what went wrong (`CorralError.code`, domain/errors.py); how a command
ends is decided here, as an HTTP API decides its statuses at its own edge. A code the table does
not name falls back to its parent class's code, then to 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import typer

from corral.domain.errors import CorralError

EXIT_CODES: Mapping[str, int] = {
    "config_invalid": 2,
    "invalid_request": 2,
    "store_unavailable": 3,
    "engine_fenced": 3,
    "not_found": 4,
    "conflict": 5,
    "engine_running": 6,
    "engine_not_running": 7,
    "not_permitted": 10,
    "backpressure": 75,  # EX_TEMPFAIL
    # the answers of a remote engine's HTTP API (--url): its error codes are the domain's, and
    # these three of its own
    "rate_limited": 75,
    "unauthenticated": 10,
    "unreachable": 7,
}
OTHER = 1  # an error without an entry of its own or of a parent's


def exit_code(err: CorralError) -> int:
    """The exit code for `err`: its own code (an HTTP API's answer carries one per error), its
    class's, else the nearest parent's that has one."""
    own = vars(err).get("code")
    if isinstance(own, str) and own in EXIT_CODES:
        return EXIT_CODES[own]
    for cls in type(err).__mro__:
        code = vars(cls).get("code")
        if isinstance(code, str) and code in EXIT_CODES:
            return EXIT_CODES[code]
    return OTHER


def fail(err: CorralError) -> NoReturn:
    """End the command with `err`'s one line on stderr and its exit code."""
    typer.echo(f"corral: error: {err}", err=True)
    raise typer.Exit(exit_code(err))
