"""`/api/v1/epics` (api/epics.py): the token's tenant's epics listed, shown with their tasks
and waves, and cancelled; another tenant's epic is not found; a reader cannot cancel."""

from __future__ import annotations

from pathlib import Path

from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from tests.unit.test_api_jobs import Api, assert_problem, config, with_api


def epic(epic_id: str, tenant: str) -> EpicRecord:
    return EpicRecord(
        id=epic_id,
        name="greet",
        tenant=tenant,
        repo="/srv/repo",
        base="abc",
        branch="epic/greet",
        spec={"name": "greet", "max_waves": 7, "tasks": []},
        state=EpicState.RUNNING,
        wave=0,
        created_at=1.0,
        updated_at=1.0,
    )


async def seed(api: Api) -> None:
    await api.store.create_epic(
        epic("e-acme", "acme"),
        [TaskRecord(epic_id="e-acme", task_id="a", position=0, state=TaskState.OPEN)],
    )
    await api.store.create_epic(epic("e-globex", "globex"), [])
    running = TaskRecord(
        epic_id="e-acme",
        task_id="a",
        position=0,
        state=TaskState.RUNNING,
        attempts=1,
        verdict={"why": "<script>alert(1)</script>"},
    )
    await api.store.begin_wave(
        WaveRecord(epic_id="e-acme", wave=1, started_at=2.0, tasks={"a": 1}), [running], 2.0
    )


def test_epics_of_the_tokens_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        await seed(api)
        r = await api.client.get("/api/v1/epics", headers=api.auth("reader"))
        assert r.status_code == 200, r.text
        [e] = r.json()["epics"]
        assert (e["id"], e["state"], e["wave"], e["max_waves"]) == ("e-acme", "running", 1, 7)
        assert [t["state"] for t in e["tasks"]] == ["running"]

        r = await api.client.get("/api/v1/epics/e-acme", headers=api.auth("reader"))
        assert r.status_code == 200, r.text
        shown = r.json()
        assert shown["waves"][0]["tasks"] == {"a": 1}
        assert shown["tasks"][0]["verdict"] == {"why": "<script>alert(1)</script>"}  # JSON: data
        r = await api.client.get("/api/v1/epics/e-globex", headers=api.auth("reader"))
        assert_problem(r, 404, "not_found")

        r = await api.client.post("/api/v1/epics/e-acme/cancel", headers=api.auth("reader"))
        assert_problem(r, 403, "not_permitted")
        r = await api.client.post(
            "/api/v1/epics/e-acme/cancel", json={"reason": "enough"}, headers=api.auth("writer")
        )
        assert r.status_code == 200, r.text
        assert r.json()["cancel_requested"].startswith("enough (by token:")
        r = await api.client.post("/api/v1/epics/e-globex/cancel", headers=api.auth("writer"))
        assert_problem(r, 404, "not_found")
        r = await api.client.get("/api/v1/epics", headers=api.auth(None))
        assert r.status_code == 401

    with_api(config(tmp_path), body)
