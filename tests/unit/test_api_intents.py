"""The AgentOps intent surface in process: 202 with a place in the queue and a start estimate,
the intent's status, cancel 200 then 409, a notebook body refused naming the missing worker,
and the token's tenant only."""

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
        notebook = await api.client.post(
            "/agentops/intents",
            headers=h,
            json={"source": "print(1)", "environment": {"python": "3.11"}},
        )
        assert "notebook worker" in assert_problem(notebook, 422, "invalid_request")["detail"]

    with_api(config(tmp_path), body)
