"""corral.yaml: parsing and validation at the edge (pydantic), resolved into frozen domain values.

Where the file comes from: `--config`, else `$CORRAL_CONFIG`, else `./corral.yaml`, else
`<data dir>/corral.yaml`, else built-in defaults (one `default` role, one `local` environment).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.domain.errors import ConfigError
from corral.domain.models import Limits
from corral.domain.settings import EnvSpec, RetryPolicy, RoleSpec, SchedulerSpec, Settings

CONFIG_NAME = "corral.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsModel(_Strict):
    max_attempts: int = Field(4, ge=1, le=100)
    timeout_s: float = Field(3600.0, gt=0)
    grace_s: float = Field(10.0, ge=0)


class RetryModel(_Strict):
    base_s: float = Field(5.0, ge=0)
    cap_s: float = Field(300.0, ge=0)
    exit_codes: list[int] | Literal["nonzero"] = "nonzero"
    never_exit_codes: list[int] = [126, 127]
    signals: bool = True
    timeouts: bool = False
    lost: bool = True


class RoleModel(_Strict):
    description: str = ""
    worker: str = "command"
    concurrency: int = Field(4, ge=1, le=10_000)
    limits: LimitsModel = LimitsModel()
    retry: RetryModel = RetryModel()
    tools: list[str] = []
    system_prompt: str = ""


class EnvModel(_Strict):
    kind: Literal["local", "ray"] = "local"
    address: str | None = None
    max_inflight: int = Field(4, ge=1, le=10_000)


class SchedulerModel(_Strict):
    aging_s: float = Field(60.0, gt=0)
    poll_interval_s: float = Field(1.0, gt=0, le=60)


class StoreModel(_Strict):
    url: str | None = None  # None: SQLite file in the data dir; or postgresql://…
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    sqlite_busy_timeout_ms: int = Field(5000, ge=0)

    @field_validator("sqlite_synchronous", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class ConfigModel(_Strict):
    store: StoreModel = StoreModel()
    scheduler: SchedulerModel = SchedulerModel()
    default_role: str = "default"
    default_environment: str = "local"
    roles: dict[str, RoleModel] = {}
    environments: dict[str, EnvModel] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything `corral` reads at start: the settings plus where things live."""

    settings: Settings
    data_dir: Path
    store_url: str | None
    sqlite_synchronous: str
    source: Path | None
    sqlite_busy_timeout_ms: int = 5000

    @property
    def db_path(self) -> Path:
        return self.data_dir / "corral.db"


def default_data_dir() -> Path:
    env = os.environ.get("CORRAL_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "corral"


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


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


def parse(text: str, source: str) -> ConfigModel:
    """Parse and validate YAML text, or ConfigError naming the key and the reason."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}:{at}: malformed YAML: {problem}") from err
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    try:
        return ConfigModel.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise ConfigError(f"{source}: {_where(first['loc'])}: {first['msg']}{more}") from err


def _role(name: str, m: RoleModel) -> RoleSpec:
    r = m.retry
    return RoleSpec(
        name=name, worker=m.worker, concurrency=m.concurrency, tools=tuple(m.tools),
        system_prompt=m.system_prompt, description=m.description,
        limits=Limits(max_attempts=m.limits.max_attempts, timeout_s=m.limits.timeout_s,
                      grace_s=m.limits.grace_s),
        retry=RetryPolicy(
            base_s=r.base_s, cap_s=r.cap_s,
            retry_exit_codes=None if r.exit_codes == "nonzero" else frozenset(r.exit_codes),
            never_exit_codes=frozenset(r.never_exit_codes), retry_signals=r.signals,
            retry_timeouts=r.timeouts, retry_lost=r.lost))


def resolve(model: ConfigModel, source: str) -> Settings:
    roles = {name: _role(name, m) for name, m in model.roles.items()}
    roles.setdefault(model.default_role, RoleSpec(name=model.default_role))
    envs = {name: EnvSpec(name=name, kind=m.kind, address=m.address,
                          max_inflight=m.max_inflight) for name, m in model.environments.items()}
    envs.setdefault(model.default_environment, EnvSpec(name=model.default_environment))
    for name, env in envs.items():
        if env.kind == "ray" and not env.address:
            raise ConfigError(f"{source}: environments.{name}.address: a ray environment needs "
                              "the cluster address")
    return Settings(roles=roles, environments=envs,
                    scheduler=SchedulerSpec(aging_s=model.scheduler.aging_s,
                                            poll_interval_s=model.scheduler.poll_interval_s),
                    default_role=model.default_role, default_env=model.default_environment)


def load(*, data_dir: Path | None = None, config_path: Path | None = None) -> Config:
    """Read the configuration the way every `corral` command does."""
    ddir = (data_dir or default_data_dir()).expanduser().resolve()
    path = find_config(config_path, ddir)
    if path is None:
        model, source = ConfigModel(), "(defaults)"
    else:
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read {path}: {err.strerror}") from err
        model, source = parse(text, str(path)), str(path)
    url = os.environ.get("CORRAL_STORE_URL") or model.store.url
    return Config(settings=resolve(model, source), data_dir=ddir, store_url=url,
                  sqlite_synchronous=model.store.sqlite_synchronous, source=path,
                  sqlite_busy_timeout_ms=model.store.sqlite_busy_timeout_ms)
