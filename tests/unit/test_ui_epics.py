"""The dashboard's epics pages (ui/epics.py): the viewer's tenant's epics only, one epic's
tasks with their gates and judges' verdicts and its waves; everything a judge or a check wrote
is escaped."""

from __future__ import annotations

from pathlib import Path

from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from tests.unit.test_api_jobs import config
from tests.unit.test_ui import PLANT, Ui, elements, with_ui


def epic(epic_id: str, tenant: str) -> EpicRecord:
    return EpicRecord(
        id=epic_id,
        name=f"greet-{tenant}",
        tenant=tenant,
        repo="/srv/repo",
        base="abc123",
        branch="epic/greet",
        spec={"name": "greet", "max_waves": 7, "tasks": []},
        state=EpicState.RUNNING,
        wave=0,
        created_at=1.0,
        updated_at=1.0,
    )


async def seed(u: Ui) -> None:
    open_a = TaskRecord(epic_id="e-acme", task_id="alpha", position=0, state=TaskState.OPEN)
    await u.store.create_epic(epic("e-acme", "acme"), [open_a])
    await u.store.create_epic(epic("e-globex", "globex"), [])
    verdict = {
        "attempt": 1,
        "gate": "fail",
        "council": "FAIL",
        "why": PLANT,
        "judges": [{"vendor": "claude-code", "verdict": "FAIL", "key_insight": PLANT}],
        "checks": [{"command": "make test", "exit_code": 1, "output": PLANT}],
    }
    running = open_a.with_(state=TaskState.RUNNING, attempts=1, verdict=verdict)
    await u.store.begin_wave(
        WaveRecord(epic_id="e-acme", wave=1, started_at=2.0, tasks={"alpha": 1}), [running], 2.0
    )


def test_epic_pages_show_the_tenants_epics_with_everything_escaped(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        await seed(u)
        await u.login("reader")
        listing = await u.client.get("/ui/epics")
        assert listing.status_code == 200, listing.text
        assert "greet-acme" in listing.text and "greet-globex" not in listing.text
        assert 'href="/ui/epics"' in listing.text  # in the navigation
        page = await u.client.get("/ui/epics/e-acme")
        assert page.status_code == 200, page.text
        tags = elements(page.text)
        assert not [a for t, a in tags if t == "img" or a.get("id") == "planted"]
        assert not [a for _, a in tags if any(k.startswith("on") for k in a)]
        assert page.text.count("&lt;b id=&#34;planted&#34;&gt;") == 3  # why, judge, check
        assert "wave 1/7" in page.text and "alpha (1)" in page.text
        for r in (listing, page):
            assert "unsafe-inline" not in r.headers["content-security-policy"]
            assert [a for t, a in elements(r.text) if t == "script" and not a.get("src")] == []
        other = await u.client.get("/ui/epics/e-globex")
        assert other.status_code == 404

    with_ui(config(tmp_path), body)


def test_an_escalated_and_a_replaced_task_say_so(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        why = {"gate": "fail", "why": "check `make` exited 2"}
        await u.store.create_epic(
            epic("e-split", "acme"),
            [
                TaskRecord(epic_id="e-split", task_id="big", position=0,
                           state=TaskState.DECOMPOSED,
                           verdict={**why, "replaced_by": ["big-one", "big-two"]}),
                TaskRecord(epic_id="e-split", task_id="wide", position=1,
                           state=TaskState.ESCALATED, verdict={**why, "escalation": "human"}),
            ],
        )  # fmt: skip
        await u.login("reader")
        page = await u.client.get("/ui/epics/e-split")
        assert page.status_code == 200, page.text
        assert "(replaced by big-one, big-two)" in page.text
        assert "(escalated: human)" in page.text

    with_ui(config(tmp_path), body)
