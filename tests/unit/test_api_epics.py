"""`/api/v1/epics` (api/epics.py): the token's tenant's epics listed, shown with their tasks
and waves, and cancelled; another tenant's epic is not found; a reader cannot cancel. An epic
starts over HTTP only in a repository under `api.epic_repos` (none by default), its mistakes
named as 4xx problems."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import ConfigError
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


OPEN = """\
roles:
  coder: {worker: claude-code}
  judge: {worker: claude-code}
api: {rate_limit: {per_s: 1000, burst: 1000}, epic_repos: [REPOS]}
"""
EPIC = {
    "name": "greet",
    "council": {"judges": 0},
    "tasks": [{"id": "hello", "role": "coder", "prompt": "write hello.txt"}],
}


def repo_at(where: Path) -> Path:
    where.mkdir(parents=True)
    git = ["git", "-c", "user.name=D", "-c", "user.email=d@x"]
    (where / "README").write_text("x\n")
    for args in (["init", "-q", "-b", "main"], ["add", "README"], ["commit", "-qm", "i"]):
        subprocess.run([*git, *args], cwd=where, check=True, capture_output=True)
    return where


def test_an_epic_starts_from_the_api_under_an_open_directory(tmp_path: Path) -> None:
    repos = tmp_path / "repos"
    repo = repo_at(repos / "project")
    closed = repo_at(tmp_path / "elsewhere")

    async def body(api: Api) -> None:
        post = api.client.post
        r = await post("/api/v1/epics", json={"repo": str(repo), "epic": EPIC},
                       headers=api.auth("writer"))  # fmt: skip
        assert r.status_code == 201, r.text
        started = r.json()
        assert (started["name"], started["state"], started["branch"]) == (
            "greet",
            "running",
            "epic/greet",
        )
        assert [t["id"] for t in started["tasks"]] == ["hello"]
        epic = await api.store.get_epic(started["id"])
        assert (epic.tenant, epic.repo) == ("acme", str(repo))
        r = await api.client.get(f"/api/v1/epics/{epic.id}", headers=api.auth("reader"))
        assert r.status_code == 200

        # The same as YAML text; its branch exists now: 409.
        yaml_text = "name: greet\ntasks: [{id: a, role: coder, prompt: p}]\n"
        r = await post("/api/v1/epics", json={"repo": str(repo), "epic": yaml_text},
                       headers=api.auth("writer"))  # fmt: skip
        assert_problem(r, 409, "conflict")

        bad = {**EPIC, "name": "other", "tasks": [{**EPIC["tasks"][0], "depends_on": ["nope"]}]}
        for sent, status, code, detail in [
            ({"repo": str(repo), "epic": bad}, 422, "invalid_request", "depends_on[0]: no task"),
            ({"repo": str(repo), "epic": "name: [x"}, 422, "invalid_request", "not valid YAML"),
            ({"repo": str(repo), "epic": {**EPIC, "name": "x", "tasks": [
                {**EPIC["tasks"][0], "role": "nobody"}]}}, 422, "invalid_request",
             "no role 'nobody'"),
            ({"repo": str(repo), "epic": EPIC, "extra": 1}, 422, "invalid_request", "extra"),
            ({"repo": str(repo), "epic": {**EPIC, "name": "w", "decomposer": "nobody"}}, 422,
             "invalid_request", "decomposer: no role 'nobody'"),
            ({"repo": str(repo), "epic": {**EPIC, "name": "v", "on_exhausted": "retry"}}, 422,
             "invalid_request", "on_exhausted: 'retry' is not strike, decompose or human"),
            ({"repo": str(repo / "sub"), "epic": {**EPIC, "name": "y"}}, 422,
             "invalid_request", "not a git repository"),
            ({"repo": "project", "epic": EPIC}, 422, "invalid_request", "not an absolute path"),
            ({"repo": str(closed), "epic": EPIC}, 403, "not_permitted", "not under any"),
            ({"repo": f"{repos}/../elsewhere", "epic": EPIC}, 403, "not_permitted", "not under"),
        ]:  # fmt: skip
            r = await post("/api/v1/epics", json=sent, headers=api.auth("writer"))
            assert detail in assert_problem(r, status, code)["detail"], (sent, r.text)
        r = await post("/api/v1/epics", json={"repo": str(repo), "epic": EPIC},
                       headers=api.auth("reader"))  # fmt: skip
        assert_problem(r, 403, "not_permitted")
        assert len(await api.store.list_epics()) == 1  # nothing else started

    text = OPEN.replace("REPOS", str(repos))
    with_api(config(tmp_path, text), body)


def test_epics_from_the_api_are_closed_by_default(tmp_path: Path) -> None:
    repo = repo_at(tmp_path / "project")

    async def body(api: Api) -> None:
        r = await api.client.post(
            "/api/v1/epics", json={"repo": str(repo), "epic": EPIC}, headers=api.auth("writer")
        )
        assert "set api.epic_repos" in assert_problem(r, 403, "not_permitted")["detail"]

    with_api(config(tmp_path), body)


def test_epic_repos_must_be_absolute(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'repos' is not an absolute path"):
        config(tmp_path, "api: {epic_repos: [repos]}\n")


def test_an_open_directory_inside_a_closed_repository_is_refused(tmp_path: Path) -> None:
    repo = repo_at(tmp_path / "project")
    (repo / "src").mkdir()

    async def body(api: Api) -> None:
        r = await api.client.post(
            "/api/v1/epics",
            json={"repo": str(repo / "src"), "epic": EPIC},
            headers=api.auth("writer"),
        )
        detail = assert_problem(r, 403, "not_permitted")["detail"]
        assert f"the repository {repo} is not under any of api.epic_repos" in detail
        assert git_branches(repo) == ["main"]  # no branch made

    with_api(config(tmp_path, OPEN.replace("REPOS", str(repo / "src"))), body)


def git_branches(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "branch", "--format=%(refname:short)"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()
