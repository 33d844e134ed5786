"""A Ray cluster's health, asked of its dashboard over HTTP (no `ray` import): nodes alive,
CPUs and GPUs total and used, and its jobs by status (Corral's own and the others). For
`corral status`, the API's environments and the metrics (services/clusters.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from corral.workers import rayauth

TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterHealth:
    env: str
    address: str
    reachable: bool
    error: str | None = None
    nodes_alive: int = 0
    nodes_dead: int = 0
    cpus_total: float = 0.0
    cpus_used: float = 0.0
    gpus_total: float = 0.0
    gpus_used: float = 0.0
    jobs: dict[str, int] = field(default_factory=dict)  # by Ray status, every job Ray knows
    corral_jobs: dict[str, int] = field(default_factory=dict)  # by status, Corral's own


def _get(address: str, path: str, timeout: float, token: str | None = None) -> Any:
    req = urllib.request.Request(f"{address.rstrip('/')}{path}", headers=rayauth.headers(token))
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def reachable(address: str, token: str | None = None, timeout: float = TIMEOUT_S) -> str | None:
    """Whether the job server answers now: None when it does, else why not. The cheapest call
    of its API, for the core's health probe (core/server.py). A refusal of the token (401, 403)
    is an answer: the cluster is up and the attempts fail on it with that error, loudly, instead
    of waiting in the queue for a cluster that is not down."""
    try:
        _get(address, "/api/version", timeout, token)
    except urllib.error.HTTPError as err:
        if err.code < 500:
            return None
        return rayauth.scrub(f"HTTP {err.code} from the job server", token)
    except (OSError, ValueError) as err:
        return rayauth.scrub(str(err), token)[:300]
    return None


def probe(
    env: str, address: str, timeout: float = TIMEOUT_S, token: str | None = None
) -> ClusterHealth:
    """Ask the cluster now; an unreachable one says so (never raises)."""
    try:
        status = _get(address, "/api/cluster_status", timeout, token)
        jobs = _get(address, "/api/jobs/", timeout, token)
    except (OSError, ValueError) as err:
        error = rayauth.scrub(str(err), token)[:300]
        return ClusterHealth(env=env, address=address, reachable=False, error=error)
    data = (status or {}).get("data", {}).get("clusterStatus", {}) or {}
    report = data.get("autoscalerReport", {}) or {}
    usage = (data.get("loadMetricsReport", {}) or {}).get("usage", {}) or {}
    cpu, gpu = usage.get("CPU", [0.0, 0.0]), usage.get("GPU", [0.0, 0.0])
    alive = sum(int(v) for v in (report.get("activeNodes") or {}).values())
    alive += sum(int(v) for v in (report.get("idleNodes") or {}).values())
    by_status = Counter(str(j.get("status")) for j in jobs if isinstance(j, dict))
    ours = Counter(
        str(j.get("status"))
        for j in jobs
        if isinstance(j, dict) and str(j.get("submission_id") or "").startswith("corral-")
    )
    return ClusterHealth(
        env=env,
        address=address,
        reachable=True,
        nodes_alive=alive,
        nodes_dead=len(report.get("failedNodes") or []),
        cpus_total=float(cpu[1]),
        cpus_used=float(cpu[0]),
        gpus_total=float(gpu[1]),
        gpus_used=float(gpu[0]),
        jobs=dict(sorted(by_status.items())),
        corral_jobs=dict(sorted(ours.items())),
    )
