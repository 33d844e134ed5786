"""Where the configuration file and the data directory are, found without reading either.

Kept apart from config.py (its pydantic models and their validation) so that a command that
needs only its data directory when no configuration file exists, `corral jobs`, does not import
them; config.py uses these very functions, so both find the same file.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.domain.errors import ConfigError

CONFIG_NAME = "corral.yaml"
DB_NAME = "corral.db"  # the SQLite store's file in the data directory (no store.url)
SQLITE_BUSY_TIMEOUT_MS = 5000  # store.sqlite_busy_timeout_ms's default


def default_data_dir() -> Path:
    env = os.environ.get("CORRAL_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "corral"


def data_dir_of(data_dir: Path | None) -> Path:
    """The data directory a command works in, absolute (`--data-dir`, else the default)."""
    return (data_dir or default_data_dir()).expanduser().resolve()


def find_config(explicit: Path | None, data_dir: Path) -> Path | None:
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"config file not found: {explicit}")
        return explicit
    env = os.environ.get("CORRAL_CONFIG")
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise ConfigError(f"config file not found: {p} (from CORRAL_CONFIG)")
        return p
    for p in (Path.cwd() / CONFIG_NAME, data_dir / CONFIG_NAME):
        if p.is_file():
            return p
    return None
