"""The environments and, for each Ray environment, its cluster's health asked now
(workers/rayhealth.py): `corral status`, `GET /api/v1/environments` and the metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from corral.config import Config
from corral.domain.errors import WorkerMisconfigured
from corral.domain.settings import EnvSpec
from corral.workers import rayauth
from corral.workers.rayhealth import ClusterHealth, probe


def _health(env: EnvSpec) -> ClusterHealth:
    try:
        token = rayauth.token(env)
    except WorkerMisconfigured as err:
        return ClusterHealth(
            env=env.name, address=str(env.address), reachable=False, error=str(err)
        )
    return probe(env.name, str(env.address), token=token)


def clusters(config: Config) -> list[ClusterHealth]:
    """Every Ray environment's health, asked in parallel (each bounded by its timeout)."""
    envs = [e for e in config.settings.environments.values() if e.kind == "ray" and e.address]
    if not envs:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(envs))) as pool:
        return list(pool.map(_health, envs))


def environments(config: Config) -> list[dict[str, Any]]:
    """Each environment: its kind, its caps and, for a Ray one, its cluster's health."""
    health = {h.env: h for h in clusters(config)}
    out = []
    for env in sorted(config.settings.environments.values(), key=lambda e: e.name):
        h = health.get(env.name)
        out.append(
            {
                "name": env.name,
                "kind": env.kind,
                "address": env.address,
                "max_inflight": env.max_inflight,
                "max_queued": env.max_queued,
                "cluster": None if h is None else asdict(h),
            }
        )
    return out
