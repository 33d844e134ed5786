"""corral.yaml as every `corral` command reads it: the Config, and how it is loaded.

Where the file comes from: `--config`, else `$CORRAL_CONFIG`, else `./corral.yaml`, else
`<data dir>/corral.yaml`, else built-in defaults (one `default` role, one `local` environment).

A file is validated by its pydantic schema (config_models.py) the first time it is read. What it
resolves to is kept in the data directory (config_cache.py), so the next command with the same
file, and the same files it names, loads it without importing pydantic at all: validation was
a quarter of a short command's CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from corral import config_cache
from corral.config_paths import DB_NAME, SQLITE_BUSY_TIMEOUT_MS, data_dir_of, find_config
from corral.config_sections import AGENT_ADAPTERS as AGENT_ADAPTERS  # re-exported
from corral.config_sections import (
    ApiSection,
    AuditSection,
    CoreSection,
    EngineSection,
    group_id,
)
from corral.config_sections import ConfigProblems as ConfigProblems  # re-exported
from corral.domain.errors import ConfigError
from corral.domain.settings import Settings

if TYPE_CHECKING:
    from corral.policy.guardrails import Guardrails


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything `corral` reads at start: the settings plus where things live."""

    settings: Settings
    data_dir: Path
    store_url: str | None
    sqlite_synchronous: str
    source: Path | None
    sqlite_busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS
    core: CoreSection = field(default_factory=CoreSection)
    secrets_key_file: Path | None = None  # None: <data dir>/secrets.key
    audit: AuditSection = field(default_factory=AuditSection)
    text: str = ""  # the file as read ("" for the built-in defaults): what an engine publishes
    socket_group: int | None = None  # engine.socket_group's gid (runtime/peers.py)
    engine: EngineSection = field(default_factory=EngineSection)
    api: ApiSection = field(default_factory=ApiSection)

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_NAME

    @property
    def secrets_key(self) -> Path:
        """The key that seals submissions' secrets (workers/sealing.py)."""
        return self.secrets_key_file or self.data_dir / "secrets.key"

    @property
    def audit_key(self) -> Path:
        """The key the audit chains are hashed with (store/chain.py)."""
        return Path(self.audit.key_file) if self.audit.key_file else self.data_dir / "audit.key"

    @property
    def audit_checkpoints(self) -> Path:
        """The signed checkpoints of the chains' heads (store/checkpoints.py)."""
        return self.data_dir / "audit-checkpoints.jsonl"


def guardrails_of(settings: Settings, source: str = "corral.yaml") -> Guardrails:
    """The shipped guardrails, with the configured file's rules over them."""
    from corral.policy.guardrails import default_guardrails, load_rules

    rules = default_guardrails()
    if settings.guardrails_file is None:
        return rules
    try:
        return rules.merged(load_rules(Path(settings.guardrails_file)))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{source}: guardrails: {err}") from None


def load(*, data_dir: Path | None = None, config_path: Path | None = None) -> Config:
    """Read the configuration the way every `corral` command does."""
    ddir = data_dir_of(data_dir)
    path = find_config(config_path, ddir)
    text = ""
    if path is not None:
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read {path}: {err.strerror}") from err
    source = str(path) if path is not None else "(defaults)"
    cache = config_cache.Cache(ddir, text, path)
    found = cache.get()
    if found is None:
        from corral import config_models  # pydantic: only for a file not seen before

        found = config_models.file_settings(text, path)
        cache.put(found)
    try:
        group = group_id(found.engine.socket_group)
    except ValueError as err:
        raise ConfigError(f"{source}: engine.socket_group: {err}") from None
    return Config(
        socket_group=group,
        engine=found.engine,
        settings=found.settings,
        data_dir=ddir,
        store_url=os.environ.get("CORRAL_STORE_URL") or found.store_url,
        sqlite_synchronous=found.sqlite_synchronous,
        source=path,
        sqlite_busy_timeout_ms=found.sqlite_busy_timeout_ms,
        core=found.core,
        secrets_key_file=Path(found.secrets_key_file) if found.secrets_key_file else None,
        audit=found.audit,
        text=text,
        api=found.api,
    )
