"""The configuration the engine runs, as it recorded it when it started (runtime/published.py),
beside the local one: what `corral config show` prints."""

from __future__ import annotations

from dataclasses import dataclass

from corral.config import Config
from corral.core.ports import EngineConfig, EngineRegistry
from corral.runtime.published import fingerprint, redacted


@dataclass(frozen=True, slots=True)
class ConfigView:
    """The active configuration (None: no engine has recorded one) and the local one, each
    with its secret values redacted and its hash."""

    active: EngineConfig | None
    local_source: str | None
    local_text: str
    local_hash: str

    @property
    def text(self) -> str:
        """The text commands check against: the engine's, else the local one."""
        return self.active.text if self.active else self.local_text

    @property
    def same(self) -> bool:
        """Whether the local file is the one the engine runs (or no engine recorded one)."""
        return self.active is None or self.active.hash == self.local_hash


async def config_view(store: EngineRegistry, local: Config) -> ConfigView:
    text = redacted(local.text)
    return ConfigView(
        await store.active_config(),
        str(local.source) if local.source else None,
        text,
        fingerprint(text),
    )
