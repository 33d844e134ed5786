"""`/api/v1/tokens` in process (httpx ASGITransport over create_app, the in-memory store): an
admin token creates a token (its text answered once and working at once), lists them without
a secret or hash, revokes one (then refused, 401); every other scope is 403, no token 401; each
creation and revocation is on the audit chain as done by `token:<id>` — never the token."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_api_jobs import Api, assert_problem, config, with_api


def test_an_admin_token_creates_lists_and_revokes_tokens_on_the_audit_chain(
    tmp_path: Path,
) -> None:
    async def body(api: Api) -> None:
        c, admin = api.client, api.auth("admin")
        r = await c.post(
            "/api/v1/tokens",
            json={"scopes": ["jobs:read"], "name": "ci", "expires_in_s": 3600},
            headers=admin,
        )
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["tenant"] == "acme" and made["scopes"] == ["jobs:read"]
        assert made["created_by"].startswith("token:") and made["expires_at"] is not None
        new = {"Authorization": f"Bearer {made['token']}"}
        assert (await c.get("/api/v1/jobs", headers=new)).status_code == 200
        assert_problem(
            await c.post("/api/v1/jobs", json={"command": ["true"]}, headers=new),
            403,
            "not_permitted",
        )

        other = await c.post(
            "/api/v1/tokens", json={"tenant": "globex", "scopes": ["jobs:write"]}, headers=admin
        )
        assert other.status_code == 201 and other.json()["tenant"] == "globex"

        listed = await c.get("/api/v1/tokens", headers=admin)
        assert made["id"] in [t["id"] for t in listed.json()]
        assert made["token"] not in listed.text and "secret" not in listed.text

        revoked = await c.post(f"/api/v1/tokens/{made['id']}/revoke", headers=admin)
        assert revoked.status_code == 200 and revoked.json()["revoked_by"].startswith("token:")
        assert_problem(await c.get("/api/v1/jobs", headers=new), 401, "unauthenticated")
        assert_problem(
            await c.post(f"/api/v1/tokens/{made['id']}/revoke", headers=admin), 409, "conflict"
        )
        assert_problem(await c.post("/api/v1/tokens/nope/revoke", headers=admin), 404, "not_found")

        events = [e for e in await api.store.token_events() if e.token_id == made["id"]]
        assert [(e.action, e.actor) for e in events] == [
            ("created", made["created_by"]),
            ("revoked", made["created_by"]),
        ]
        secret_hash = (await api.store.token(made["id"])).secret_hash
        assert made["token"] not in repr(events) and secret_hash not in repr(events)
        assert (await api.store.verify_audit()).ok

    with_api(config(tmp_path), body)


def test_tokens_need_the_admin_scope(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        c = api.client
        for who in ("writer", "reader", "approver", "scraper"):
            h = api.auth(who)
            assert_problem(await c.get("/api/v1/tokens", headers=h), 403, "not_permitted")
            assert_problem(
                await c.post("/api/v1/tokens", json={"scopes": ["admin"]}, headers=h),
                403,
                "not_permitted",
            )
            assert_problem(await c.post("/api/v1/tokens/x/revoke", headers=h), 403, "not_permitted")
        assert_problem(await c.get("/api/v1/tokens"), 401, "unauthenticated")
        bad = await c.post("/api/v1/tokens", json={"scopes": ["root"]}, headers=api.auth("admin"))
        assert_problem(bad, 422, "invalid_request")
        empty = await c.post("/api/v1/tokens", json={"scopes": []}, headers=api.auth("admin"))
        assert_problem(empty, 422, "invalid_request")

    with_api(config(tmp_path), body)
