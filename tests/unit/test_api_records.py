"""The HTTP API's governance records in process: incidents, runs and the policy log of the
token's tenant only; the audit check for admin tokens only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_api_jobs import Api, assert_problem, config, with_api


@pytest.mark.parametrize("path", ["/api/v1/incidents", "/api/v1/runs", "/api/v1/policy-log"])
def test_records_of_the_tenant_only(tmp_path: Path, path: str) -> None:
    async def body(api: Api) -> None:
        mine = (await api.submit()).json()["job"]["id"]
        theirs = (await api.submit("other")).json()["job"]["id"]
        assert_problem(await api.client.get(path), 401, "unauthenticated")
        assert_problem(
            await api.client.get(path, headers=api.auth("approver")), 403, "not_permitted"
        )
        r = await api.client.get(path, headers=api.auth("reader"))
        assert r.status_code == 200, r.text
        if path == "/api/v1/runs":
            assert [x["job_id"] for x in r.json()] == [mine]
        else:
            assert all(x.get("job_id", x.get("job")) == mine for x in r.json())
            r = await api.client.get(path, params={"job": theirs}, headers=api.auth("reader"))
            assert_problem(r, 404, "not_found")
        other = await api.client.get(path, headers=api.auth("other"))
        assert mine not in other.text
        if path == "/api/v1/policy-log":  # the limit counts the tenant's own records
            for _ in range(3):
                await api.submit("other")
            r = await api.client.get(path, params={"limit": 1}, headers=api.auth("reader"))
            assert [x["job"] for x in r.json()] == [mine]

    with_api(config(tmp_path), body)


def test_audit_verify_is_for_admin_tokens(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        assert_problem(
            await api.client.get("/api/v1/audit/verify", headers=api.auth("writer")),
            403,
            "not_permitted",
        )
        r = await api.client.get("/api/v1/audit/verify", headers=api.auth("admin"))
        assert r.status_code == 200, r.text
        assert set(r.json()) >= {"ok", "checked", "problems"}

    with_api(config(tmp_path), body)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/status"),
        ("GET", "/api/v1/breakers"),
        ("GET", "/api/v1/escalations"),
        ("POST", "/api/v1/breakers/worker:command/reset"),
        ("POST", "/api/v1/escalations/e1/clear"),
    ],
)
def test_the_mechanism_is_for_admin_and_says_when_no_engine_answers(
    tmp_path: Path, method: str, path: str
) -> None:
    async def body(api: Api) -> None:
        assert_problem(await api.client.request(method, path), 401, "unauthenticated")
        assert_problem(
            await api.client.request(method, path, headers=api.auth("writer")), 403, "not_permitted"
        )
        r = await api.client.request(method, path, headers=api.auth("admin"))
        assert "no engine is serving" in assert_problem(r, 503, "engine_not_running")["detail"]

    with_api(config(tmp_path), body)


def test_workspaces_for_admin(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        assert_problem(
            await api.client.get("/api/v1/workspaces", headers=api.auth("reader")),
            403,
            "not_permitted",
        )
        assert (await api.client.get("/api/v1/workspaces", headers=api.auth("admin"))).json() == []

    with_api(config(tmp_path), body)


def test_metrics_are_for_a_metrics_token_and_name_no_job(tmp_path: Path) -> None:
    """GET /metrics (outside /api/v1, where Prometheus looks) is the fleet's exposition: every
    tenant's figures, aggregated, so a token needs the `metrics` scope (or admin) and the body
    names no job."""

    async def body(api: Api) -> None:
        job_id = (await api.submit()).json()["job"]["id"]
        assert_problem(await api.client.get("/metrics"), 401, "unauthenticated")
        assert_problem(
            await api.client.get("/metrics", headers=api.auth("reader")), 403, "not_permitted"
        )
        for who in ("scraper", "admin"):
            r = await api.client.get("/metrics", headers=api.auth(who))
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert "corral_engine_up 0" in r.text  # no engine serves this data directory
            assert "corral_queue_depth" in r.text and job_id not in r.text
        scraper = await api.client.get("/api/v1/jobs", headers=api.auth("scraper"))
        assert_problem(scraper, 403, "not_permitted")

    with_api(config(tmp_path), body)
