"""The HTTP API's governance routes in process: kill switches, pauses and approvals for the
token's tenant, attributed to the token, with the authorisation matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.domain.tokens import split_token
from tests.unit.test_api_jobs import CONFIG, Api, assert_problem, config, with_api

GATED = CONFIG.replace("roles:\n", "roles:\n  gated: {requires_approval: true}\n")


def token_actor(api: Api, who: str) -> str:
    parts = split_token(api.tok[who])
    assert parts is not None
    return f"token:{parts[0]}"


def test_kill_switches_and_pauses_of_the_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        h = api.auth("admin")
        r = await api.client.post("/api/v1/kill-switches", json={"reason": "stop acme"}, headers=h)
        assert r.status_code == 201, r.text
        switch = r.json()
        assert (switch["scope"], switch["target"], switch["created_by"]) == (
            "tenant",
            "acme",
            token_actor(api, "admin"),
        )
        listed = await api.client.get("/api/v1/kill-switches", headers=h)
        assert [s["id"] for s in listed.json()] == [switch["id"]]
        lifted = await api.client.post(f"/api/v1/kill-switches/{switch['id']}/lift", headers=h)
        assert lifted.status_code == 200 and lifted.json()["lifted_at"] is not None
        assert_problem(
            await api.client.post(f"/api/v1/kill-switches/{switch['id']}/lift", headers=h),
            404,
            "not_found",
        )
        p = await api.client.post("/api/v1/pauses", json={"reason": "calm"}, headers=h)
        assert p.status_code == 201 and p.json()["created_by"] == token_actor(api, "admin")
        assert len((await api.client.get("/api/v1/pauses", headers=h)).json()) == 1
        resumed = await api.client.post("/api/v1/pauses/resume", json={}, headers=h)
        assert [x["id"] for x in resumed.json()] == [p.json()["id"]]

    with_api(config(tmp_path), body)


def test_a_govern_token_controls_its_tenant_only(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        from corral.services import tokens

        govern = (await tokens.create(api.store, tenant="acme", scopes="govern", by="test")).text
        h = {"Authorization": f"Bearer {govern}"}
        ok = await api.client.post(
            "/api/v1/kill-switches", json={"reason": "x", "scope": "tenant"}, headers=h
        )
        assert ok.status_code == 201
        for beyond in (
            {"scope": "global"},
            {"scope": "tenant", "target": "globex"},
            {"scope": "role", "target": "small"},
        ):
            r = await api.client.post(
                "/api/v1/kill-switches", json={"reason": "x", **beyond}, headers=h
            )
            assert_problem(r, 403, "not_permitted")
        theirs = (await api.submit("other")).json()["job"]["id"]
        r = await api.client.post(
            "/api/v1/pauses", json={"reason": "x", "scope": "job", "target": theirs}, headers=h
        )
        assert_problem(r, 404, "not_found")
        # a global switch an admin set applies to every tenant: the govern token sees it
        await api.client.post(
            "/api/v1/kill-switches",
            json={"reason": "all", "scope": "global"},
            headers=api.auth("admin"),
        )
        seen = (await api.client.get("/api/v1/kill-switches", headers=h)).json()
        assert sorted(s["scope"] for s in seen) == ["global", "tenant"]
        other_view = await api.client.get("/api/v1/kill-switches", headers=api.auth("other"))
        assert_problem(other_view, 403, "not_permitted")

    with_api(config(tmp_path), body)


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_approvals_are_decided_by_the_token_of_the_jobs_tenant(
    tmp_path: Path, decision: str
) -> None:
    async def body(api: Api) -> None:
        job = (await api.submit(role="gated")).json()["job"]
        assert job["state"] == "AWAITING_APPROVAL", job
        listed = await api.client.get("/api/v1/approvals", headers=api.auth("approver"))
        assert [a["job_id"] for a in listed.json()] == [job["id"]]
        approval = listed.json()[0]["id"]
        url = f"/api/v1/approvals/{approval}/{decision}"
        assert_problem(await api.client.post(url), 401, "unauthenticated")
        assert_problem(await api.client.post(url, headers=api.auth("writer")), 403, "not_permitted")
        other = await tokens_for(api, "globex", "approve")
        assert_problem(await api.client.post(url, headers=other), 404, "not_found")
        assert (await api.client.get("/api/v1/approvals", headers=other)).json() == []
        r = await api.client.post(url, json={"note": "ok"}, headers=api.auth("approver"))
        assert r.status_code == 200, r.text
        assert r.json()["decided_by"] == token_actor(api, "approver")
        assert r.json()["state"] == ("approved" if decision == "approve" else "denied")

    with_api(config(tmp_path, GATED), body)


async def tokens_for(api: Api, tenant: str, scopes: str) -> dict[str, str]:
    from corral.services import tokens

    made = await tokens.create(api.store, tenant=tenant, scopes=scopes, by="test")
    return {"Authorization": f"Bearer {made.text}"}


def test_the_next_submission_sees_a_kill_switch_made_through_the_api(tmp_path: Path) -> None:
    """The API keeps its submission service, and what its pre-run gate read, between requests
    (services/submissions.py KeptSubmissions); a kill switch made through the API still reaches
    the very next submission, DENIED at once, and lifting it lets the one after queue."""

    async def body(api: Api) -> None:
        h = api.auth("admin")
        first = await api.submit()
        assert first.status_code == 201 and first.json()["job"]["state"] == "QUEUED"
        made = await api.client.post("/api/v1/kill-switches", json={"reason": "halt"}, headers=h)
        assert made.status_code == 201, made.text
        denied = (await api.submit()).json()["job"]
        assert denied["state"] == "DENIED"
        assert denied["last_error"].startswith("kill_switch_active"), denied["last_error"]
        lift = await api.client.post(f"/api/v1/kill-switches/{made.json()['id']}/lift", headers=h)
        assert lift.status_code == 200
        assert (await api.submit()).json()["job"]["state"] == "QUEUED"

    with_api(config(tmp_path), body)
