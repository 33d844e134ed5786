"""Epics over SQL (the EpicStore port, core/ports.py; tables epics, epic_tasks, epic_waves,
migration 0022). Every change is compare-and-set on the row's state."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import Conflict, NotFound, StaleState
from corral.store.driver import Driver, Row, Tx

_EPIC = (
    "id, name, tenant, repo, base, branch, spec, state, wave, created_at, updated_at,"
    " cancel_requested, reason"
)
_TASK = (
    "epic_id, task_id, position, state, attempts, failures, job_id, judges, commit_sha, verdict,"
    " updated_at"
)


def _epic(r: Row) -> EpicRecord:
    return EpicRecord(
        id=r["id"],
        name=r["name"],
        tenant=r["tenant"],
        repo=r["repo"],
        base=r["base"],
        branch=r["branch"],
        spec=json.loads(r["spec"]),
        state=EpicState(r["state"]),
        wave=int(r["wave"]),
        created_at=float(r["created_at"]),
        updated_at=float(r["updated_at"]),
        cancel_requested=r["cancel_requested"],
        reason=r["reason"],
    )


def _task(r: Row) -> TaskRecord:
    return TaskRecord(
        epic_id=r["epic_id"],
        task_id=r["task_id"],
        position=int(r["position"]),
        state=TaskState(r["state"]),
        attempts=int(r["attempts"]),
        failures=int(r["failures"]),
        job_id=r["job_id"],
        judges=tuple(json.loads(r["judges"])),
        commit=r["commit_sha"],
        verdict=None if r["verdict"] is None else json.loads(r["verdict"]),
        updated_at=float(r["updated_at"]),
    )


def _task_params(t: TaskRecord) -> tuple[Any, ...]:
    return (
        t.epic_id,
        t.task_id,
        t.position,
        t.state.value,
        t.attempts,
        t.failures,
        t.job_id,
        json.dumps(list(t.judges)),
        t.commit,
        None if t.verdict is None else json.dumps(t.verdict, sort_keys=True),
        t.updated_at,
    )


def _wave(r: Row) -> WaveRecord:
    return WaveRecord(
        epic_id=r["epic_id"],
        wave=int(r["wave"]),
        started_at=float(r["started_at"]),
        tasks={k: int(v) for k, v in json.loads(r["tasks"]).items()},
        ended_at=None if r["ended_at"] is None else float(r["ended_at"]),
        results=None if r["results"] is None else json.loads(r["results"]),
        head=r["head"],
    )


class SqlEpics:
    """Mixed into SqlStore."""

    driver: Driver

    async def create_epic(self, epic: EpicRecord, tasks: Sequence[TaskRecord]) -> None:
        async with self.driver.write() as tx:
            if await tx.fetchone("SELECT id FROM epics WHERE id = ?", (epic.id,)):
                raise Conflict(f"epic {epic.id} exists")
            await tx.execute(
                f"INSERT INTO epics ({_EPIC}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    epic.id,
                    epic.name,
                    epic.tenant,
                    epic.repo,
                    epic.base,
                    epic.branch,
                    json.dumps(epic.spec, sort_keys=True),
                    epic.state.value,
                    epic.wave,
                    epic.created_at,
                    epic.updated_at,
                    epic.cancel_requested,
                    epic.reason,
                ),
            )
            for t in tasks:
                await tx.execute(
                    f"INSERT INTO epic_tasks ({_TASK}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    _task_params(t),
                )

    async def get_epic(self, epic_id: str) -> EpicRecord:
        async with self.driver.read() as tx:
            return await _get(tx, epic_id)

    async def list_epics(
        self, *, tenant: str | None = None, running: bool = False, limit: int = 100
    ) -> list[EpicRecord]:
        where, params = [], []
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        if running:
            where.append("state = ?")
            params.append(EpicState.RUNNING.value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT {_EPIC} FROM epics{clause} ORDER BY id DESC LIMIT ?", (*params, limit)
            )
        return [_epic(r) for r in rows]

    async def epic_tasks(self, epic_id: str) -> list[TaskRecord]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                f"SELECT {_TASK} FROM epic_tasks WHERE epic_id = ? ORDER BY position", (epic_id,)
            )
        return [_task(r) for r in rows]

    async def epic_waves(self, epic_id: str) -> list[WaveRecord]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT epic_id, wave, started_at, tasks, ended_at, results, head"
                " FROM epic_waves WHERE epic_id = ? ORDER BY wave",
                (epic_id,),
            )
        return [_wave(r) for r in rows]

    async def begin_wave(self, wave: WaveRecord, tasks: Sequence[TaskRecord], now: float) -> None:
        async with self.driver.write() as tx:
            moved = await tx.execute(
                "UPDATE epics SET wave = ?, updated_at = ? WHERE id = ? AND state = ? AND wave < ?",
                (wave.wave, now, wave.epic_id, EpicState.RUNNING.value, wave.wave),
            )
            if moved != 1:
                raise StaleState(f"epic {wave.epic_id} is not running before wave {wave.wave}")
            await tx.execute(
                "INSERT INTO epic_waves (epic_id, wave, started_at, tasks) VALUES (?, ?, ?, ?)",
                (wave.epic_id, wave.wave, wave.started_at, json.dumps(wave.tasks, sort_keys=True)),
            )
            for t in tasks:
                await _save_task(tx, t, TaskState.OPEN)

    async def save_task(self, task: TaskRecord, *, expect: TaskState) -> None:
        async with self.driver.write() as tx:
            await _save_task(tx, task, expect)

    async def end_wave(
        self, epic_id: str, wave: int, *, results: Mapping[str, str], head: str, at: float
    ) -> None:
        async with self.driver.write() as tx:
            await tx.execute(
                "UPDATE epic_waves SET ended_at = ?, results = ?, head = ?"
                " WHERE epic_id = ? AND wave = ?",
                (at, json.dumps(dict(results), sort_keys=True), head, epic_id, wave),
            )

    async def replan_epic(
        self,
        epic_id: str,
        spec: Mapping[str, Any],
        *,
        replaced: TaskRecord,
        added: Sequence[TaskRecord],
        at: float,
    ) -> None:
        order = [t["id"] for t in spec["tasks"]]
        async with self.driver.write() as tx:
            moved = await tx.execute(
                "UPDATE epics SET spec = ?, updated_at = ? WHERE id = ? AND state = ?",
                (json.dumps(dict(spec), sort_keys=True), at, epic_id, EpicState.RUNNING.value),
            )
            if moved != 1:
                raise StaleState(f"epic {epic_id} is not running")
            await _save_task(tx, replaced, TaskState.ESCALATED)
            for t in added:
                await tx.execute(
                    f"INSERT INTO epic_tasks ({_TASK}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    _task_params(t.with_(position=order.index(t.task_id))),
                )
            for i, task_id in enumerate(order):
                await tx.execute(
                    "UPDATE epic_tasks SET position = ? WHERE epic_id = ? AND task_id = ?",
                    (i, epic_id, task_id),
                )

    async def end_epic(self, epic_id: str, state: EpicState, reason: str, at: float) -> None:
        async with self.driver.write() as tx:
            moved = await tx.execute(
                "UPDATE epics SET state = ?, reason = ?, updated_at = ? WHERE id = ? AND state = ?",
                (state.value, reason, at, epic_id, EpicState.RUNNING.value),
            )
            if moved != 1:
                raise StaleState(f"epic {epic_id} is not running")

    async def cancel_epic(self, epic_id: str, reason: str, at: float) -> EpicRecord:
        async with self.driver.write() as tx:
            epic = await _get(tx, epic_id)
            if epic.state.terminal:
                raise Conflict(f"epic {epic_id} already ended ({epic.state.value})")
            if epic.cancel_requested is None:
                await tx.execute(
                    "UPDATE epics SET cancel_requested = ?, updated_at = ? WHERE id = ?",
                    (reason, at, epic_id),
                )
                epic = epic.with_(cancel_requested=reason, updated_at=at)
            return epic

    async def claim_epics(self, holder: str, *, now: float, lease_s: float) -> bool:
        async with self.driver.write() as tx:
            n = await tx.execute(_LEASE, (holder, now + lease_s, now))
        return n == 1


# The engine that drives the epics holds a row of gc_lease (migration 0017) named `epics`.
_LEASE = (
    "INSERT INTO gc_lease (name, holder, lease_until) VALUES ('epics', ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
    "lease_until = excluded.lease_until "
    "WHERE gc_lease.holder = excluded.holder OR gc_lease.lease_until < ?"
)


async def _get(tx: Tx, epic_id: str) -> EpicRecord:
    row = await tx.fetchone(f"SELECT {_EPIC} FROM epics WHERE id = ?", (epic_id,))
    if row is None:
        raise NotFound(f"no epic {epic_id}")
    return _epic(row)


async def _save_task(tx: Tx, t: TaskRecord, expect: TaskState) -> None:
    moved = await tx.execute(
        "UPDATE epic_tasks SET state = ?, attempts = ?, failures = ?, job_id = ?, judges = ?,"
        " commit_sha = ?, verdict = ?, updated_at = ?"
        " WHERE epic_id = ? AND task_id = ? AND state = ?",
        (*_task_params(t)[3:], t.epic_id, t.task_id, expect.value),
    )
    if moved != 1:
        raise StaleState(f"task {t.task_id} of epic {t.epic_id} is not {expect.value}")
