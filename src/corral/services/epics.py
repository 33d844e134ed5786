"""Epics for every edge (the `corral epic` commands, the HTTP API, the dashboard): start one
from its file, list, show and cancel. The engine's WaveRunner (services/waves.py) runs them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.config import Config
from corral.core.ports import EpicStore
from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import Conflict, InvalidRequest, NotFound
from corral.domain.ids import new_id
from corral.services import Wake
from corral.waves.epic import EpicSpec, load
from corral.workers import gitrepo


@dataclass(frozen=True, slots=True)
class EpicDetail:
    epic: EpicRecord
    tasks: list[TaskRecord]
    waves: list[WaveRecord]


def check_roles(spec: EpicSpec, config: Config) -> None:
    """Every task's role and every judge's role is one the configuration has."""
    roles = config.settings.roles
    for i, t in enumerate(spec.tasks):
        if t.role not in roles:
            raise InvalidRequest(f"tasks[{i}].role: no role {t.role!r} in the configuration")
    if spec.council.judges:
        for i, r in enumerate(spec.council.roles):
            if r not in roles:
                raise InvalidRequest(f"council.roles[{i}]: no role {r!r} in the configuration")


async def start(
    store: EpicStore,
    config: Config,
    text: str,
    *,
    repo: Path,
    base: str | None = None,
    tenant: str = "default",
    wake: Wake,
    clock: Callable[[], float] = time.time,
) -> EpicRecord:
    """Validate an epic file, make its branch in the target repository from `base` (default
    HEAD), persist the epic and wake the engine, which runs its waves."""
    spec = load(text)
    check_roles(spec, config)
    try:
        top = await gitrepo.toplevel(repo.resolve())
    except gitrepo.GitError as err:
        raise InvalidRequest(f"--repo {repo}: not a git repository ({err})") from None
    try:
        base_sha = await gitrepo.commit_of(top, base or "HEAD")
    except gitrepo.GitError:
        raise InvalidRequest(f"--base {base or 'HEAD'}: no such commit in {top}") from None
    if await gitrepo.branch_exists(top, spec.branch):
        raise Conflict(
            f"branch {spec.branch} exists in {top}: give the epic another `branch` (or delete it)"
        )
    await gitrepo.create_branch(top, spec.branch, base_sha)
    now = clock()
    epic = EpicRecord(
        id=new_id(),
        name=spec.name,
        tenant=tenant,
        repo=str(top),
        base=base_sha,
        branch=spec.branch,
        spec=spec.to_data(),
        state=EpicState.RUNNING,
        wave=0,
        created_at=now,
        updated_at=now,
    )
    tasks = [
        TaskRecord(epic_id=epic.id, task_id=t.id, position=i, state=TaskState.OPEN, updated_at=now)
        for i, t in enumerate(spec.tasks)
    ]
    await store.create_epic(epic, tasks)
    wake("wake")
    return epic


async def resolve(store: EpicStore, ref: str, tenant: str | None = None) -> EpicRecord:
    """An epic by id or a unique prefix of it (of the tenant, when one is given)."""
    try:
        epic = await store.get_epic(ref)
    except NotFound:
        found = [
            e for e in await store.list_epics(tenant=tenant, limit=10_000) if e.id.startswith(ref)
        ]
        if len(found) != 1:
            why = "matches several epics" if found else "matches no epic"
            raise NotFound(f"{ref!r} {why}") from None
        epic = found[0]
    if tenant is not None and epic.tenant != tenant:
        raise NotFound(f"no epic {ref}")
    return epic


async def detail(store: EpicStore, ref: str, tenant: str | None = None) -> EpicDetail:
    epic = await resolve(store, ref, tenant)
    return EpicDetail(epic, await store.epic_tasks(epic.id), await store.epic_waves(epic.id))


async def listing(
    store: EpicStore, tenant: str | None = None, limit: int = 100
) -> list[EpicDetail]:
    out = []
    for epic in await store.list_epics(tenant=tenant, limit=limit):
        out.append(EpicDetail(epic, await store.epic_tasks(epic.id), []))
    return out


async def cancel(
    store: EpicStore,
    ref: str,
    *,
    reason: str,
    wake: Wake,
    tenant: str | None = None,
    clock: Callable[[], float] = time.time,
) -> EpicRecord:
    """Ask a running epic to stop: the engine cancels its live jobs and ends it."""
    epic = await resolve(store, ref, tenant)
    got = await store.cancel_epic(epic.id, reason, clock())
    wake("wake")
    return got
