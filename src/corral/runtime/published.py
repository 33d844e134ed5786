"""One configuration wherever a command runs: the engine's.

An engine records the configuration it serves with when it starts (`Store.publish_config`):
the file's text with secret-looking values redacted, and that text's sha256. Commands that check
a submission against the roles, environments and limits (`submit`, `dlq requeue`, `approvals`,
`policy check`) use the latest one, so `corral submit --role notebook` in another shell finds
the roles of the engine's file; a command run with a different local file is told so. `corral
config show` prints it.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from corral.config import Config
from corral.core.ports import EngineConfig, EngineRegistry
from corral.domain.errors import ConfigError
from corral.policy.redact import MARK, SECRET_NAME, Redactor

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=16)
def redacted(text: str) -> str:
    """The configuration as YAML, every value under a secret-looking key (`api_key`, `token`,
    `password`, an `Authorization` header …) and every credential shape replaced. Remembered
    for the last few texts: every submission compares its configuration with the engine's, and
    parsing and dumping YAML each time was a tenth of an API submission's cost."""
    data = yaml.load(text, Loader=_LOADER) if text.strip() else {}
    return yaml.safe_dump(_redact(data or {}, Redactor()), sort_keys=False)


def _redact(value: Any, r: Redactor) -> Any:
    if isinstance(value, dict):  # a number under a name like `token_budget_in` is no secret
        return {
            k: MARK if _secret_key(k) and isinstance(v, str) else _redact(v, r)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact(v, r) for v in value]
    return r.text(value) if isinstance(value, str) else value


def _secret_key(key: Any) -> bool:
    return isinstance(key, str) and (
        SECRET_NAME.search(key) is not None or key.lower() == "authorization"
    )


def fingerprint(text: str) -> str:
    """The sha256 of a redacted configuration text."""
    return hashlib.sha256(text.encode()).hexdigest()


def record(cfg: Config, engine_id: str, now: float) -> EngineConfig:
    """What an engine publishes about its configuration when it starts."""
    text = redacted(cfg.text)
    return EngineConfig(
        engine_id=engine_id,
        at=now,
        hash=fingerprint(text),
        source=str(cfg.source) if cfg.source else None,
        text=text,
    )


def effective(local: Config, active: EngineConfig | None) -> tuple[Config, str | None]:
    """The configuration a command checks submissions against — the engine's when one has
    published it, else the local one — and a note for the operator when their local file is
    not the engine's (or the engine's cannot be used here)."""
    if active is None:
        return local, None
    mine = fingerprint(redacted(local.text))
    if mine == active.hash:
        return local, None
    where = active.source or "the built-in defaults"
    from corral.config_models import parse, resolve  # validated here: the engine's is another

    try:
        source = active.source or "(defaults)"
        settings = resolve(parse(active.text, source), source)
    except ConfigError as err:
        return local, (
            f"the engine's configuration ({where}) cannot be used here ({err}); "
            "checking against the local one"
        )
    note = None
    if local.source is not None:
        note = (
            f"{local.source} (config {mine[:8]}) is not the configuration the engine runs "
            f"({where}, config {active.hash[:8]}): using the engine's; `corral config show` "
            "prints it"
        )
    return replace(
        local,
        settings=settings,
        source=Path(active.source) if active.source else None,
        text=active.text,
    ), note


async def active_config(store: EngineRegistry, local: Config) -> tuple[Config, str | None]:
    """`effective` with the store's latest published configuration."""
    return effective(local, await store.active_config())
