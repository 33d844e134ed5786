"""Read models of the dashboard (the `ui` edge): the fleet overview that answers "is the fleet
healthy, and what needs me?", a filtered page of jobs, and the environments against their caps.

Who sees what follows the HTTP API: a token sees its own tenant's jobs, approvals and
controls; the fleet's aggregates (jobs by state, queues and in-flight attempts against caps)
need the `metrics` scope, and the engine's mechanism (breakers, watchdog) the `admin` scope."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from corral.config import Config
from corral.core.ports import JobGovernance, JobQuery, JobStore
from corral.domain.errors import CorralError
from corral.domain.governance import Approval, ApprovalState, KillSwitch, Pause
from corral.domain.models import Job
from corral.domain.states import JobState
from corral.domain.tokens import ApiToken
from corral.services import controls, engine, tenancy

Clock = Callable[[], float]
THROUGHPUT_CAP = 5_000  # jobs ended in the last hour the throughput chart reads at most
BUCKET_S = 300.0  # the throughput chart: twelve five-minute buckets over the last hour
BUCKETS = 12
WAITING = (JobState.QUEUED.value, JobState.RETRY_WAIT.value)


@dataclass(frozen=True, slots=True)
class Lane:
    """A role's or an environment's jobs waiting and attempts running against its cap."""

    name: str
    queued: int
    inflight: int
    cap: int | None
    max_queued: int | None = None


@dataclass(frozen=True, slots=True)
class Overview:
    counts: dict[str, int]
    counts_of: str  # "the fleet", or which of the tenant's jobs were counted
    roles: list[Lane]
    environments: list[Lane]
    throughput: list[int]  # jobs ended per bucket, oldest first
    kill_switches: list[KillSwitch]
    pauses: list[Pause]
    approvals: list[Approval]
    engine: dict[str, Any] | None = None  # the core's snapshot (admin only)
    engine_error: str | None = None
    jobs_of: dict[str, Job] = field(default_factory=dict)  # the pending approvals' jobs


def throughput(jobs: list[Job], now: float) -> list[int]:
    """Jobs that ended in each five-minute bucket of the last hour (by their last update)."""
    out = [0] * BUCKETS
    start = now - BUCKET_S * BUCKETS
    for j in jobs:
        if j.state.terminal and start <= j.updated_at <= now:
            out[min(BUCKETS - 1, int((j.updated_at - start) // BUCKET_S))] += 1
    return out


def lanes(
    counted: dict[tuple[str, str, str], int], config: Config
) -> tuple[list[Lane], list[Lane]]:
    """Per role and per environment: jobs waiting, jobs running and the configured caps."""
    queued_role: Counter[str] = Counter()
    queued_env: Counter[str] = Counter()
    run_role: Counter[str] = Counter()
    run_env: Counter[str] = Counter()
    for (role, env, state), n in counted.items():
        by_role, by_env = (queued_role, queued_env) if state in WAITING else (run_role, run_env)
        by_role[role] += n
        by_env[env] += n
    settings = config.settings
    role_names = sorted(set(settings.roles) | set(queued_role) | set(run_role))
    env_names = sorted(set(settings.environments) | set(queued_env) | set(run_env))
    roles = [
        Lane(
            r,
            queued_role[r],
            run_role[r],
            settings.roles[r].concurrency if r in settings.roles else None,
        )
        for r in role_names
    ]
    envs = [
        Lane(
            e,
            queued_env[e],
            run_env[e],
            settings.environments[e].max_inflight if e in settings.environments else None,
            settings.environments[e].max_queued if e in settings.environments else None,
        )
        for e in env_names
    ]
    return roles, envs


async def fleet_lanes(store: JobStore, config: Config) -> tuple[list[Lane], list[Lane]]:
    """The roles' and environments' lanes, read now (fleet-wide)."""
    return lanes(await store.lane_counts(), config)


async def overview(
    store: JobGovernance, config: Config, token: ApiToken, *, clock: Clock = time.time
) -> Overview:
    """The first screen for `token`: its tenant's jobs (with `jobs:read`; the fleet's with
    `metrics`), what is stopped or paused, the approvals waiting (with `approve`), and (with
    `admin`) the engine's mechanism."""
    now = clock()
    fleet = token.allows("metrics")
    reads = fleet or token.allows("jobs:read")
    roles: list[Lane] = []
    envs: list[Lane] = []
    counts: dict[str, int] = {}
    ended: list[Job] = []
    if reads:
        tenant = None if fleet else token.tenant
        counts = await store.counts(tenant)
        since = now - BUCKET_S * BUCKETS
        ended = await store.list_jobs(
            JobQuery(tenant=tenant, ended_since=since, limit=THROUGHPUT_CAP)
        )
    if fleet:
        roles, envs = await fleet_lanes(store, config)
    counts_of = "the fleet" if fleet else (f"tenant {token.tenant}" if reads else "")
    admin = token.allows("admin")
    switches = await tenancy.visible_controls(
        store, await controls.kill_switches(store, clock), token.tenant, admin=admin
    )
    pauses = await tenancy.visible_controls(
        store, await store.pauses(active_only=True), token.tenant, admin=admin
    )
    pending = (
        await tenancy.approvals_of(store, token.tenant, state=ApprovalState.PENDING.value)
        if token.allows("approve")
        else []
    )
    snap, err = (await engine_snapshot(config.data_dir)) if admin else (None, None)
    return Overview(
        counts=counts,
        counts_of=counts_of,
        roles=roles,
        environments=envs,
        throughput=throughput(ended, now),
        kill_switches=switches,
        pauses=pauses,
        approvals=pending,
        engine=snap,
        engine_error=err,
        jobs_of={a.job_id: await store.get_job(a.job_id) for a in pending},
    )


async def engine_snapshot(data_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The core's live state, or why there is none (no engine answering)."""
    try:
        return await anyio.to_thread.run_sync(lambda: engine.snapshot(data_dir)), None
    except CorralError as err:
        return None, str(err)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFilter:
    """The jobs table's filters; empty values mean "any"."""

    state: JobState | None = None
    role: str = ""
    environment: str = ""
    tenant: str = ""  # another tenant than the token's: admin only
    text: str = ""  # a substring of the command or the prompt (ASCII letters in either case)
    cursor: str = ""  # the last job id of the previous page
    limit: int = 50


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None


async def job_page(store: JobGovernance, token: ApiToken, f: JobFilter) -> JobPage:
    """A page of the jobs `f` selects, newest first: the token's tenant's (another tenant's
    only for an admin token, as the API's submissions)."""
    tenant = tenancy.tenant_for_submission(
        token.tenant, f.tenant or None, admin=token.allows("admin")
    )
    found = await store.list_jobs(
        JobQuery(
            state=f.state,
            role=f.role or None,
            tenant=tenant,
            env_name=f.environment or None,
            before=f.cursor or None,
            text=f.text or None,
            limit=f.limit + 1,
        )
    )
    page = found[: f.limit]
    return JobPage(page, page[-1].id if len(found) > f.limit else None)


async def environments(store: JobStore, config: Config) -> list[Lane]:
    """Every environment's cap, jobs running and jobs waiting (fleet-wide)."""
    return (await fleet_lanes(store, config))[1]
