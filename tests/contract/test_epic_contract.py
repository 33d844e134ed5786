"""The epic store (EpicStore port) on memory, SQLite and PostgreSQL: epics with their tasks and
wave checkpoints, every change compare-and-set, so a resumed runner cannot begin a wave twice
nor take a task another already holds."""

from __future__ import annotations

import pytest

from corral.core.ports import Store
from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import Conflict, NotFound, StaleState
from tests.contract.conftest import UseStore


def epic(epic_id: str = "e1", tenant: str = "default") -> EpicRecord:
    return EpicRecord(
        id=epic_id,
        name="greet",
        tenant=tenant,
        repo="/tmp/repo",
        base="abc123",
        branch="epic/greet",
        spec={"name": "greet", "tasks": [{"id": "a"}]},
        state=EpicState.RUNNING,
        wave=0,
        created_at=1.0,
        updated_at=1.0,
    )


def tasks(epic_id: str = "e1") -> list[TaskRecord]:
    return [
        TaskRecord(epic_id=epic_id, task_id=t, position=i, state=TaskState.OPEN, updated_at=1.0)
        for i, t in enumerate(("a", "b"))
    ]


def test_create_get_list(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.create_epic(epic("e1"), tasks("e1"))
        await store.create_epic(epic("e2", tenant="t2"), tasks("e2"))
        assert await store.get_epic("e1") == epic("e1")
        assert [t.task_id for t in await store.epic_tasks("e1")] == ["a", "b"]
        assert await store.epic_tasks("e1") == tasks("e1")
        assert [e.id for e in await store.list_epics()] == ["e2", "e1"]
        assert [e.id for e in await store.list_epics(tenant="t2")] == ["e2"]
        assert [e.id for e in await store.list_epics(limit=1)] == ["e2"]
        with pytest.raises(Conflict):
            await store.create_epic(epic("e1"), [])
        with pytest.raises(NotFound):
            await store.get_epic("nope")

    use_store(body)


def test_wave_checkpoint_is_taken_once(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.create_epic(epic(), tasks())
        a = tasks()[0].with_(state=TaskState.RUNNING, attempts=1, updated_at=2.0)
        wave = WaveRecord(epic_id="e1", wave=1, started_at=2.0, tasks={"a": 1})
        await store.begin_wave(wave, [a], now=2.0)
        assert (await store.get_epic("e1")).wave == 1
        assert await store.epic_waves("e1") == [wave]
        assert (await store.epic_tasks("e1"))[0] == a
        with pytest.raises(StaleState):  # a second runner (or a resumed one) cannot redo it
            await store.begin_wave(wave, [a], now=3.0)
        b = tasks()[1].with_(state=TaskState.RUNNING, attempts=1)
        with pytest.raises(StaleState):  # a task not open cannot be taken by a wave
            await store.begin_wave(
                WaveRecord(epic_id="e1", wave=2, started_at=3.0, tasks={"a": 2}), [a, b], now=3.0
            )
        assert (await store.get_epic("e1")).wave == 1  # nothing of the refused wave landed
        assert (await store.epic_tasks("e1"))[1].state is TaskState.OPEN

        with_job = a.with_(job_id="j1", judges=("j2", "j3"), verdict={"gate": "pass"})
        await store.save_task(with_job, expect=TaskState.RUNNING)
        passed = with_job.with_(state=TaskState.PASSED, commit="c0ffee")
        await store.save_task(passed, expect=TaskState.RUNNING)
        with pytest.raises(StaleState):
            await store.save_task(passed.with_(state=TaskState.OPEN), expect=TaskState.RUNNING)
        assert (await store.epic_tasks("e1"))[0] == passed

        await store.end_wave("e1", 1, results={"a": "passed"}, head="c0ffee", at=4.0)
        (done,) = await store.epic_waves("e1")
        assert (done.ended_at, done.results, done.head) == (4.0, {"a": "passed"}, "c0ffee")

    use_store(body)


def test_a_replan_replaces_an_escalated_task_at_once(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.create_epic(epic(), tasks())
        a = tasks()[0].with_(state=TaskState.ESCALATED, attempts=3, verdict={"escalation": "x"})
        await store.save_task(a, expect=TaskState.OPEN)
        spec = {"name": "greet", "tasks": [{"id": "a"}, {"id": "a-1"}, {"id": "a-2"}, {"id": "b"}]}
        added = [
            TaskRecord(epic_id="e1", task_id=t, position=0, state=TaskState.OPEN, updated_at=2.0)
            for t in ("a-1", "a-2")
        ]
        replaced = a.with_(state=TaskState.DECOMPOSED, verdict={"replaced_by": ["a-1", "a-2"]})
        await store.replan_epic("e1", spec, replaced=replaced, added=added, at=2.0)
        got = await store.epic_tasks("e1")
        assert [(t.task_id, t.position, t.state) for t in got] == [
            ("a", 0, TaskState.DECOMPOSED),
            ("a-1", 1, TaskState.OPEN),
            ("a-2", 2, TaskState.OPEN),
            ("b", 3, TaskState.OPEN),
        ]
        assert got[0] == replaced
        assert (await store.get_epic("e1")).spec == spec
        with pytest.raises(StaleState):  # a resumed runner cannot replace it twice
            await store.replan_epic("e1", {"tasks": []}, replaced=replaced, added=[], at=3.0)
        assert (await store.get_epic("e1")).spec == spec  # nothing of the refused one landed
        assert len(await store.epic_tasks("e1")) == 4

    use_store(body)


def test_cancel_and_end(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.create_epic(epic(), tasks())
        got = await store.cancel_epic("e1", "operator", at=2.0)
        assert got.cancel_requested == "operator"
        assert (await store.cancel_epic("e1", "again", at=3.0)).cancel_requested == "operator"
        assert [e.id for e in await store.list_epics(running=True)] == ["e1"]
        await store.end_epic("e1", EpicState.CANCELLED, "cancelled by operator", at=4.0)
        ended = await store.get_epic("e1")
        assert (ended.state, ended.reason) == (EpicState.CANCELLED, "cancelled by operator")
        assert await store.list_epics(running=True) == []
        with pytest.raises(StaleState):
            await store.end_epic("e1", EpicState.DONE, "done", at=5.0)
        with pytest.raises(Conflict):
            await store.cancel_epic("e1", "late", at=5.0)
        with pytest.raises(StaleState):
            await store.begin_wave(
                WaveRecord(epic_id="e1", wave=1, started_at=5.0, tasks={}), [], now=5.0
            )

    use_store(body)


def test_one_engine_drives_the_epics(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.claim_epics("e1", now=10.0, lease_s=30.0)
        assert await store.claim_epics("e1", now=20.0, lease_s=30.0)  # renewed
        assert not await store.claim_epics("e2", now=49.0, lease_s=30.0)
        assert await store.claim_epics("e2", now=51.0, lease_s=30.0)  # e1's lease ran out
        assert not await store.claim_epics("e1", now=52.0, lease_s=30.0)
        assert await store.claim_gc("gc-holder", now=52.0, lease_s=30.0)  # a lease of its own

    use_store(body)
