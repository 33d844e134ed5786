"""Options every command shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="CORRAL_DATA_DIR",
        help="Where the engine keeps its database, logs and "
        "socket (default: ~/.local/share/corral).",
        show_default=False,
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="CORRAL_CONFIG",
        help="corral.yaml to read (default: ./corral.yaml, "
        "then <data dir>/corral.yaml, then built-in defaults).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
FollowOpt = Annotated[
    bool,
    typer.Option(
        "--follow",
        "-f",
        help="Stream the job's output while waiting: its stdout to stdout, its "
        "stderr to stderr (implies --wait).",
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="No status and no notes on stderr: only the job's output (with "
        "--follow) and the exit code.",
    ),
]
NoEngineOkOpt = Annotated[
    bool,
    typer.Option(
        "--no-engine-ok",
        help="Wait even when no engine serves the data directory (one may start "
        "later); without it that is an error (exit 7).",
    ),
]
