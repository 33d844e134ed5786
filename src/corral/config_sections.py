"""The parts of a loaded configuration that are not domain settings, and what one file
resolves to (FileSettings): plain frozen values, shared by the schema that validates a file
(config_models.py), the cache that keeps the result (config_cache.py) and Config (config.py)."""

from __future__ import annotations

import grp
from dataclasses import dataclass, field

from corral import config_check
from corral.config_paths import SQLITE_BUSY_TIMEOUT_MS
from corral.domain.errors import ConfigError
from corral.domain.settings import Settings

AGENT_ADAPTERS = ("claude-code", "codex", "opencode")


class ConfigProblems(ConfigError):
    """A configuration with problems: the one-line message, and each problem as `where: what`
    for `corral config check` to list one a line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(config_check.one_line(source, problems))
        self.source = source
        self.problems = problems


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreSection:
    """`core:` how the engine runs its supervised core (docs/reference/config.md)."""

    mode: str = "process"  # inline: same process (tests, benchmarks)
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    max_restarts: int = 5
    restart_window_s: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditSection:
    """`audit:` the audit chain's key and its signed checkpoints (docs/explanation/audit.md)."""

    key_file: str | None = None  # resolved against the file's directory; None: <data dir>/audit.key
    checkpoint_every_records: int = 1000
    checkpoint_every_s: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSection:
    """`engine:` its sockets' group and its heart-beat among peers on one database."""

    socket_group: str | None = None
    heartbeat_s: float = 5.0
    stale_after_s: float = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiRate:
    """Each API token's token bucket (api/ratelimit.py)."""

    per_s: float = 20.0
    burst: int = 40


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSection:
    """`api:` the HTTP API (docs/reference/http-api.md)."""

    rate_limit: ApiRate = field(default_factory=ApiRate)
    epic_repos: tuple[str, ...] = ()  # absolute directories an epic may target through the API


@dataclass(frozen=True, slots=True, kw_only=True)
class FileSettings:
    """What one configuration file resolves to, whatever the environment: what is cached."""

    settings: Settings
    store_url: str | None = None  # store.url (CORRAL_STORE_URL overrides it)
    sqlite_synchronous: str = "NORMAL"
    sqlite_busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS
    secrets_key_file: str | None = None
    core: CoreSection = field(default_factory=CoreSection)
    audit: AuditSection = field(default_factory=AuditSection)
    engine: EngineSection = field(default_factory=EngineSection)
    api: ApiSection = field(default_factory=ApiSection)
    # the other files resolving it read (MCP configs, the guardrails file): a change to one is
    # a change to the configuration
    reads: tuple[str, ...] = ()


def group_id(name: str | None) -> int | None:
    """The gid of `engine.socket_group` (None: no group); ValueError for an unknown group."""
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        if name.isdigit():
            return int(name)
        raise ValueError(f"no such group {name!r}") from None
