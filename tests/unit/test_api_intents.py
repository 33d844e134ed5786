"""The AgentOps intent surface in process: 202 with a place in the queue and a start estimate,
the intent's status, cancel 200 then 409, a notebook body made a notebook job (its bad forms
refused), and the token's tenant only."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_api_jobs import Api, assert_problem, config, with_api


def test_intents_are_jobs_of_the_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        h = api.auth("writer")
        first = await api.client.post("/agentops/intents", json={"command": ["true"]}, headers=h)
        assert first.status_code == 202, first.text
        assert first.json()["queue_position"] == 0 and first.json()["estimated_start_s"] == 0
        second = (
            await api.client.post("/agentops/intents", json={"command": ["true"]}, headers=h)
        ).json()
        assert second["queue_position"] == 1 and second["estimated_start_s"] > 0
        intent = first.json()["intent_id"]
        got = await api.client.get(f"/agentops/intents/{intent}", headers=api.auth("reader"))
        assert got.json() == {
            "status": "queued",
            "checkpoint": None,
            "tool_call_count": 0,
            "duration_ms": None,
        }
        assert_problem(
            await api.client.get(f"/agentops/intents/{intent}", headers=api.auth("other")),
            404,
            "not_found",
        )
        url = f"/agentops/intents/{intent}/cancel"
        assert_problem(await api.client.post(url, headers=api.auth("reader")), 403, "not_permitted")
        assert (await api.client.post(url, headers=h)).status_code == 200
        assert_problem(await api.client.post(url, headers=h), 409, "conflict")
        not_a_notebook = await api.client.post(
            "/agentops/intents", headers=h, json={"source": "/tmp/x.py", "environment": "local"}
        )
        assert ".ipynb" in assert_problem(not_a_notebook, 422, "invalid_request")["detail"]
        relative = await api.client.post(
            "/agentops/intents", headers=h, json={"source": "nb.ipynb", "environment": "local"}
        )
        assert "cwd" in assert_problem(relative, 422, "invalid_request")["detail"]
        notebook = await api.client.post(
            "/agentops/intents",
            headers=h,
            json={
                "source": "nb.ipynb",
                "environment": "local",
                "cwd": str(tmp_path),
                "parameters": {"day": 3},
                "copyback": "out",
            },
        )
        assert notebook.status_code == 202, notebook.text
        job = (
            await api.client.get(
                f"/api/v1/jobs/{notebook.json()['intent_id']}", headers=api.auth("reader")
            )
        ).json()
        assert job["notebook"] == {
            "source": str(tmp_path / "nb.ipynb"),
            "parameters": {"day": 3},
            "kernel": "python3",
            "copyback": str(tmp_path / "out"),
        }
        assert job["command"][1:5] == [
            "-m",
            "corral.workers.notebook",
            "--input",
            str(tmp_path / "nb.ipynb"),
        ]

    with_api(config(tmp_path), body)
