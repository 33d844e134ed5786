"""Epics for every edge (the `corral epic` commands, the HTTP API, the dashboard): start one
from its file, list, show and cancel. The engine's WaveRunner (services/waves.py) runs them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.config import Config
from corral.core.ports import EpicStore
from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import Conflict, InvalidRequest, NotFound, NotPermitted
from corral.domain.ids import new_id
from corral.services import Wake
from corral.waves.epic import EpicSpec, load, parse
from corral.workers import gitrepo


@dataclass(frozen=True, slots=True)
class EpicDetail:
    epic: EpicRecord
    tasks: list[TaskRecord]
    waves: list[WaveRecord]


def check_roles(spec: EpicSpec, config: Config) -> None:
    """Every task's, judge's and the decomposer's role is one the configuration has."""
    roles = config.settings.roles
    for i, t in enumerate(spec.tasks):
        if t.role not in roles:
            raise InvalidRequest(f"tasks[{i}].role: no role {t.role!r} in the configuration")
    if spec.decomposer is not None and spec.decomposer not in roles:
        raise InvalidRequest(f"decomposer: no role {spec.decomposer!r} in the configuration")
    if spec.council.judges:
        for i, r in enumerate(spec.council.roles):
            if r not in roles:
                raise InvalidRequest(f"council.roles[{i}]: no role {r!r} in the configuration")


def api_roots(config: Config) -> list[Path]:
    """The directories `api.epic_repos` opens to epics started over HTTP."""
    return [Path(r).resolve() for r in config.api.epic_repos]


def open_to_api(repo: str, config: Config) -> Path:
    """The repository an API caller names, if it lies under one of `api.epic_repos`
    (NotPermitted otherwise: an epic's checks run on the engine's host)."""
    roots = api_roots(config)
    if not roots:
        raise NotPermitted(
            "no repository is open to epics from the API: set api.epic_repos in corral.yaml, "
            "or start the epic with `corral epic run`"
        )
    path = Path(repo)
    if not path.is_absolute():
        raise InvalidRequest(f"repo: {repo!r} is not an absolute path")
    resolved = path.resolve()
    if not _under(resolved, roots):
        raise NotPermitted(f"repo: {repo} is not under any of api.epic_repos")
    return resolved


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


async def start(
    store: EpicStore,
    config: Config,
    text: str | dict[str, Any],
    *,
    repo: Path,
    within: Sequence[Path] | None = None,
    base: str | None = None,
    tenant: str = "default",
    wake: Wake,
    clock: Callable[[], float] = time.time,
) -> EpicRecord:
    """Validate an epic (its file's YAML text, or its data from the API), make its branch in
    the target repository from `base` (default HEAD), persist the epic and wake the engine,
    which runs its waves. `within`: the directories the repository's top must lie under."""
    spec = load(text) if isinstance(text, str) else parse(text)
    check_roles(spec, config)
    try:
        top = await gitrepo.toplevel(repo.resolve())
    except gitrepo.GitError as err:
        raise InvalidRequest(f"repo {repo}: not a git repository ({err})") from None
    if within is not None and not _under(top.resolve(), within):
        # a directory under an open one, of a repository whose top is not
        raise NotPermitted(f"repo: the repository {top} is not under any of api.epic_repos")
    try:
        base_sha = await gitrepo.commit_of(top, base or "HEAD")
    except gitrepo.GitError:
        raise InvalidRequest(f"base {base or 'HEAD'}: no such commit in {top}") from None
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
