"""The configuration the engine runs, as it recorded it when it started (runtime/published.py),
beside the local one: what `corral config show` prints. Also a configuration's every problem
(`corral config check`) and a commented starter file (`corral init`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from corral.config import Config
from corral.config_models import check
from corral.config_paths import CONFIG_NAME, default_data_dir, find_config
from corral.core.ports import EngineConfig, EngineRegistry
from corral.domain.errors import Conflict, InvalidRequest
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


@dataclass(frozen=True, slots=True)
class ConfigCheck:
    """What `corral config check` found: the file read (None: the built-in defaults) and every
    problem in it as `where: what`, in the order of the file's sections."""

    source: str | None
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_config(data_dir: Path | None, explicit: Path | None) -> ConfigCheck:
    """Check the configuration a command would read (--config, $CORRAL_CONFIG, ./corral.yaml,
    <data dir>/corral.yaml), every problem at once; ConfigError when there is no such file."""
    path = find_config(explicit, (data_dir or default_data_dir()).expanduser())
    if path is None:
        return ConfigCheck(None, [])
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        return ConfigCheck(str(path), [f"cannot read the file: {err}"])
    return ConfigCheck(str(path), check(text, str(path)))


def starter_text() -> str:
    """The commented example configuration the package ships (examples/corral.yaml)."""
    return resources.files("corral").joinpath("examples", CONFIG_NAME).read_text()


def init_config(directory: Path, *, force: bool = False) -> Path:
    """Write the starter corral.yaml into `directory` (created if missing); Conflict when one
    is there already, unless `force`. Returns the file written."""
    if directory.exists() and not directory.is_dir():
        raise InvalidRequest(f"{directory} is not a directory")
    target = directory / CONFIG_NAME
    if target.exists() and not force:
        raise Conflict(f"{target} exists already (--force writes over it)")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{CONFIG_NAME}.{os.getpid()}.tmp")
    try:
        tmp.write_text(starter_text())
        os.replace(tmp, target)
    except OSError as err:
        raise InvalidRequest(f"cannot write {target}: {err.strerror or err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return target
