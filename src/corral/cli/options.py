"""Options every command shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DataDir = Annotated[Path | None, typer.Option(
    "--data-dir", envvar="CORRAL_DATA_DIR", help="Where the engine keeps its database, logs and "
    "socket (default: ~/.local/share/corral).", show_default=False)]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", envvar="CORRAL_CONFIG", help="corral.yaml to read (default: ./corral.yaml, "
    "then <data dir>/corral.yaml, then built-in defaults).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
