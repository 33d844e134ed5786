"""Epics in memory, with the semantics of store/epics_sql.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import Conflict, NotFound, StaleState


class MemoryEpics:
    """Mixed into MemoryStore."""

    _epics: dict[str, EpicRecord]
    _epic_tasks: dict[str, dict[str, TaskRecord]]
    _epic_waves: dict[str, dict[int, WaveRecord]]
    _epic_lease: tuple[str, float] | None

    async def create_epic(self, epic: EpicRecord, tasks: Sequence[TaskRecord]) -> None:
        if epic.id in self._epics:
            raise Conflict(f"epic {epic.id} exists")
        self._epics[epic.id] = epic
        self._epic_tasks[epic.id] = {t.task_id: t for t in tasks}
        self._epic_waves[epic.id] = {}

    async def get_epic(self, epic_id: str) -> EpicRecord:
        try:
            return self._epics[epic_id]
        except KeyError:
            raise NotFound(f"no epic {epic_id}") from None

    async def list_epics(
        self, *, tenant: str | None = None, running: bool = False, limit: int = 100
    ) -> list[EpicRecord]:
        found = [
            e
            for e in self._epics.values()
            if (tenant is None or e.tenant == tenant)
            and (not running or e.state is EpicState.RUNNING)
        ]
        return sorted(found, key=lambda e: e.id, reverse=True)[:limit]

    async def epic_tasks(self, epic_id: str) -> list[TaskRecord]:
        return sorted(self._epic_tasks.get(epic_id, {}).values(), key=lambda t: t.position)

    async def epic_waves(self, epic_id: str) -> list[WaveRecord]:
        waves = self._epic_waves.get(epic_id, {})
        return [waves[n] for n in sorted(waves)]

    async def begin_wave(self, wave: WaveRecord, tasks: Sequence[TaskRecord], now: float) -> None:
        epic = self._epics.get(wave.epic_id)
        if epic is None or epic.state is not EpicState.RUNNING or epic.wave >= wave.wave:
            raise StaleState(f"epic {wave.epic_id} is not running before wave {wave.wave}")
        current = self._epic_tasks[wave.epic_id]
        for t in tasks:
            self._check(current, t, TaskState.OPEN)
        self._epics[wave.epic_id] = epic.with_(wave=wave.wave, updated_at=now)
        self._epic_waves[wave.epic_id][wave.wave] = wave
        current.update({t.task_id: t for t in tasks})

    async def save_task(self, task: TaskRecord, *, expect: TaskState) -> None:
        current = self._epic_tasks.get(task.epic_id, {})
        self._check(current, task, expect)
        current[task.task_id] = task

    @staticmethod
    def _check(current: Mapping[str, TaskRecord], t: TaskRecord, expect: TaskState) -> None:
        held = current.get(t.task_id)
        if held is None or held.state is not expect:
            raise StaleState(f"task {t.task_id} of epic {t.epic_id} is not {expect.value}")

    async def end_wave(
        self, epic_id: str, wave: int, *, results: Mapping[str, str], head: str, at: float
    ) -> None:
        waves = self._epic_waves.get(epic_id, {})
        if wave in waves:
            waves[wave] = replace(waves[wave], ended_at=at, results=dict(results), head=head)

    async def replan_epic(
        self,
        epic_id: str,
        spec: Mapping[str, Any],
        *,
        replaced: TaskRecord,
        added: Sequence[TaskRecord],
        at: float,
    ) -> None:
        epic = self._epics.get(epic_id)
        if epic is None or epic.state is not EpicState.RUNNING:
            raise StaleState(f"epic {epic_id} is not running")
        current = self._epic_tasks[epic_id]
        self._check(current, replaced, TaskState.ESCALATED)
        self._epics[epic_id] = epic.with_(spec=dict(spec), updated_at=at)
        current[replaced.task_id] = replaced
        current.update({t.task_id: t for t in added})
        for i, t in enumerate(spec["tasks"]):
            current[t["id"]] = current[t["id"]].with_(position=i)

    async def end_epic(self, epic_id: str, state: EpicState, reason: str, at: float) -> None:
        epic = self._epics.get(epic_id)
        if epic is None or epic.state is not EpicState.RUNNING:
            raise StaleState(f"epic {epic_id} is not running")
        self._epics[epic_id] = epic.with_(state=state, reason=reason, updated_at=at)

    async def cancel_epic(self, epic_id: str, reason: str, at: float) -> EpicRecord:
        epic = await self.get_epic(epic_id)
        if epic.state.terminal:
            raise Conflict(f"epic {epic_id} already ended ({epic.state.value})")
        if epic.cancel_requested is None:
            epic = epic.with_(cancel_requested=reason, updated_at=at)
            self._epics[epic_id] = epic
        return epic

    async def claim_epics(self, holder: str, *, now: float, lease_s: float) -> bool:
        if self._epic_lease and self._epic_lease[0] != holder and self._epic_lease[1] >= now:
            return False
        self._epic_lease = (holder, now + lease_s)
        return True
