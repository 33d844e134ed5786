"""The core of a configuration: its permit gate and a worker adapter per worker kind. Built by
the engine for its inline core and by `corral core` (runtime/coreproc.py), which must not import
the engine's dispatcher, governor and reporter to start."""

from __future__ import annotations

from collections.abc import Callable

from corral.config import Config
from corral.core.gateway import Core, CoreOptions
from corral.core.permits import PermitGate
from corral.core.ports import WorkerAdapter
from corral.domain.errors import WorkerMisconfigured
from corral.domain.models import Permit
from corral.domain.settings import EnvSpec, WorkerSpec
from corral.runtime.assembly import adapter_of, worker_kinds
from corral.workers import rayauth, rayhealth
from corral.workers.agents import ADAPTERS
from corral.workers.command import CommandWorker, Launch
from corral.workers.sealing import Keeper
from corral.workers.zygote import Zygote


def build_core(config: Config, zygote: Zygote | None = None) -> Core:
    """The core of `config`; its shims are forked by `zygote` (the caller's to close)."""
    gate = PermitGate(config.settings)
    launch = Launch(keeper=Keeper(config.secrets_key), settings=config.settings, zygote=zygote)
    return Core(
        gate,
        {kind: build_worker(config, gate.validate, kind, launch) for kind in worker_kinds(config)},
        CoreOptions(cluster_probe=cluster_probe),
    )


def cluster_probe(env: EnvSpec) -> str | None:
    """Whether a Ray environment's job server answers, with its token (None: it does)."""
    try:
        token = rayauth.token(env)
    except WorkerMisconfigured as err:
        return str(err)
    return rayhealth.reachable(str(env.address), token)


def build_worker(
    config: Config, validate: Callable[[Permit], None], kind: str, launch: Launch
) -> WorkerAdapter:
    adapter = adapter_of(config, kind)
    if adapter == "command":
        return CommandWorker(validate, kind, launch)
    spec = config.settings.workers.get(kind) or WorkerSpec(name=kind, adapter=adapter)
    return ADAPTERS[adapter](validate, spec, config.settings.roles, config.data_dir, launch)
