"""The HTTP API's budgets and dark launches in process: a govern token sets its tenant's
budget; role budgets and dark launches need admin; every change is recorded as the token's."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_api_governance import tokens_for
from tests.unit.test_api_jobs import Api, assert_problem, config, with_api


def test_budgets_of_the_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        h = await tokens_for(api, "acme", "govern")
        r = await api.client.post("/api/v1/budgets", json={"ceiling_usd": 5}, headers=h)
        assert r.status_code == 200, r.text
        assert (r.json()["scope"], r.json()["target"], r.json()["headroom_usd"]) == (
            "tenant",
            "acme",
            5,
        )
        for beyond in ({"target": "globex"}, {"scope": "role", "target": "small"}):
            r = await api.client.post(
                "/api/v1/budgets", json={"ceiling_usd": 1, **beyond}, headers=h
            )
            assert_problem(r, 403, "not_permitted")
        admin = api.auth("admin")
        assert (
            await api.client.post(
                "/api/v1/budgets",
                json={"ceiling_usd": 1, "scope": "tenant", "target": "globex"},
                headers=admin,
            )
        ).is_success
        seen = (await api.client.get("/api/v1/budgets", headers=h)).json()
        assert [b["target"] for b in seen] == ["acme"]
        assert len((await api.client.get("/api/v1/budgets", headers=admin)).json()) == 2

    with_api(config(tmp_path), body)


def test_dark_launches_are_set_by_admin(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        h = await tokens_for(api, "acme", "govern")
        url = "/api/v1/dark-launches/wf-1"
        assert_problem(
            await api.client.post(url, json={"percentage": 10}, headers=h), 403, "not_permitted"
        )
        admin = api.auth("admin")
        assert_problem(await api.client.post(url, json={}, headers=admin), 422, "invalid_request")
        r = await api.client.post(url, json={"percentage": 10}, headers=admin)
        assert r.status_code == 200 and r.json()["percentage"] == 10 and r.json()["enabled"]
        off = await api.client.post(url, json={"enabled": False}, headers=admin)
        assert off.json()["enabled"] is False and off.json()["percentage"] == 10
        listed = (await api.client.get("/api/v1/dark-launches", headers=h)).json()
        assert [d["workflow"] for d in listed] == ["wf-1"]

    with_api(config(tmp_path), body)
