"""The HTTP API's job routes in process (httpx ASGITransport over create_app, the in-memory
store): the authorisation matrix (no token / wrong scope / other tenant / right scope),
idempotency, 409, 429 with Retry-After, and problem+json on every error path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from corral.api import create_app
from corral.api.app import MAX_BODY_BYTES
from corral.config import Config, load
from corral.domain import bounds
from corral.domain.states import JobState
from corral.services import tokens
from corral.store.memory import MemoryStore
from corral.trace.ids import trace_id_hex
from tests.contract.test_store_contract import NOW, claim, ending

CONFIG = """\
default_role: small
scheduler: {max_queued: 3, backpressure_retry_after_s: 7}
roles:
  small: {limits: {max_attempts: 2, timeout_s: 60}}
api: {rate_limit: {per_s: 1000, burst: 1000}}
"""
PROBLEM = "application/problem+json"


@dataclass
class Api:
    client: httpx.AsyncClient
    store: MemoryStore
    tok: dict[str, str]  # who → bearer text

    def auth(self, who: str | None) -> dict[str, str]:
        return {} if who is None else {"Authorization": f"Bearer {self.tok[who]}"}

    async def submit(self, who: str = "writer", **body: Any) -> httpx.Response:
        return await self.client.post(
            "/api/v1/jobs", json={"command": ["true"], **body}, headers=self.auth(who)
        )


TOKENS = {
    "writer": ("acme", "jobs:read,jobs:write"),
    "reader": ("acme", "jobs:read"),
    "approver": ("acme", "approve"),
    "other": ("globex", "jobs:read,jobs:write"),
    "admin": ("acme", "admin"),
    "scraper": ("acme", "metrics"),
}


def config(tmp_path: Path, text: str = CONFIG) -> Config:
    (tmp_path / "corral.yaml").write_text(text)
    return load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")


def with_api(cfg: Config, body: Callable[[Api], Awaitable[None]]) -> None:
    async def main() -> None:
        store = MemoryStore()
        made = {
            who: (await tokens.create(store, tenant=t, scopes=s, by="test")).text
            for who, (t, s) in TOKENS.items()
        }
        app = create_app(cfg, store, wake=lambda op: None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await body(Api(client, store, made))

    anyio.run(main)


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    data: dict[str, Any] = r.json()
    assert {"type", "title", "status", "detail", "code"} <= set(data)
    assert (data["status"], data["code"]) == (status, code)
    assert "Traceback" not in r.text
    return data


def test_submit_then_read_back_with_the_tokens_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        r = await api.submit(env={"A": "1"}, priority=1, timeout_s=30, max_attempts=1)
        assert r.status_code == 201, r.text
        job = r.json()["job"]
        assert (job["tenant"], job["priority"], job["timeout_s"], job["max_attempts"]) == (
            "acme",
            1,
            30,
            1,
        )
        got = await api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.auth("reader"))
        assert got.status_code == 200 and got.json()["id"] == job["id"]
        first = got.json()["timeline"][0]
        writer = tokens.split_token(api.tok["writer"])
        assert writer is not None
        assert first["kind"] == "submitted" and first["data"]["by"] == f"token:{writer[0]}"
        assert got.json()["trace_id"] == trace_id_hex(job["id"])  # the job's spans' trace
        page = await api.client.get("/api/v1/jobs", headers=api.auth("reader"))
        assert [j["id"] for j in page.json()["jobs"]] == [job["id"]]
        for ref in (job["id"][-6:], job["id"][:2], "0"):  # whole ids only: prefixes leak
            assert_problem(
                await api.client.get(f"/api/v1/jobs/{ref}", headers=api.auth("other")),
                404,
                "not_found",
            )
            assert_problem(
                await api.client.get(f"/api/v1/jobs/{ref}", headers=api.auth("reader")),
                404,
                "not_found",
            )
        empty = await api.client.get("/api/v1/jobs", headers=api.auth("other"))
        assert empty.json() == {"jobs": [], "next_cursor": None}

    with_api(config(tmp_path), body)


def test_a_body_names_another_tenant_only_with_admin(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        assert_problem(await api.submit(tenant="globex"), 403, "not_permitted")
        r = await api.submit("admin", tenant="globex")
        assert r.status_code == 201 and r.json()["job"]["tenant"] == "globex"

    with_api(config(tmp_path), body)


def test_the_idempotency_key_coalesces_like_submit_key(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        headers = {**api.auth("writer"), "Idempotency-Key": "k1"}
        first = await api.client.post("/api/v1/jobs", json={"command": ["true"]}, headers=headers)
        again = await api.client.post("/api/v1/jobs", json={"command": ["true"]}, headers=headers)
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json()["created"] is False
        assert again.json()["job"]["id"] == first.json()["job"]["id"]
        assert first.json()["job"]["key"] == "k1"

    with_api(config(tmp_path), body)


def test_over_the_queue_cap_is_429_with_retry_after(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        for _ in range(3):
            assert (await api.submit()).status_code == 201
        r = await api.submit()
        assert_problem(r, 429, "backpressure")
        assert r.headers["Retry-After"] == "7"

    with_api(config(tmp_path), body)


def test_a_throttled_environment_answers_429_before_its_queue_is_full(tmp_path: Path) -> None:
    """Predictive throttling over HTTP: a burst into an environment whose queue holds 20 is
    refused at about half of that, as backpressure with a Retry-After (nothing drains: the
    configured fallback); priority 0 still gets in."""
    text = CONFIG.replace("max_queued: 3", "max_queued: 1000") + (
        "environments:\n  local:\n    max_queued: 20\n"
        "    throttle: {threshold: 0.5, release: 0.25, window_s: 60, horizon_s: 30}\n"
    )

    async def body(api: Api) -> None:
        admitted = 0
        while (r := await api.submit()).status_code == 201:
            admitted += 1
            assert admitted < 20
        problem = assert_problem(r, 429, "backpressure")
        assert problem["detail"].startswith("throttled: environment local:")
        assert r.headers["Retry-After"] == "7" and 0 < admitted < 15
        assert (await api.submit(priority=0)).status_code == 201

    with_api(config(tmp_path, text), body)


def test_the_rate_limit_per_token_is_429_with_retry_after(tmp_path: Path) -> None:
    text = CONFIG.replace("per_s: 1000, burst: 1000", "per_s: 0.5, burst: 2")

    async def body(api: Api) -> None:
        for _ in range(2):
            assert (await api.client.get("/api/v1/jobs", headers=api.auth("reader"))).is_success
        r = await api.client.get("/api/v1/jobs", headers=api.auth("reader"))
        assert_problem(r, 429, "rate_limited")
        assert r.headers["Retry-After"] == "2"
        # another token has its own bucket
        assert (await api.client.get("/api/v1/jobs", headers=api.auth("writer"))).is_success

    with_api(config(tmp_path, text), body)


def test_cancel_is_attributed_and_409_once_ended(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        job_id = (await api.submit()).json()["job"]["id"]
        url = f"/api/v1/jobs/{job_id}/cancel"
        r = await api.client.post(url, json={"reason": "enough"}, headers=api.auth("writer"))
        assert r.status_code == 200, r.text
        token_id = tokens.split_token(api.tok["writer"])
        assert token_id is not None
        assert r.json()["cancel_requested"] == f"enough (by token:{token_id[0]})"
        assert r.json()["state"] == "CANCELLED"  # a queued job ends at once
        assert_problem(await api.client.post(url, headers=api.auth("writer")), 409, "conflict")

    with_api(config(tmp_path), body)


def test_wait_logs_trace_and_report_of_a_queued_job(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        job_id = (await api.submit()).json()["job"]["id"]
        base, h = f"/api/v1/jobs/{job_id}", api.auth("reader")
        w = await api.client.get(f"{base}/wait", params={"timeout_s": 0.3}, headers=h)
        assert w.status_code == 200 and w.json()["state"] == "QUEUED"
        logs = await api.client.get(f"{base}/logs", headers=h)
        assert logs.json() == {
            "attempt": None,
            "stream": "stdout",
            "offset": 0,
            "next_offset": 0,
            "complete": False,
            "data": "",
        }
        assert (await api.client.get(f"{base}/trace", headers=h)).json()["agent_events"] == []
        report = (await api.client.get(f"{base}/report", headers=h)).json()
        assert report["report"] is None and "QUEUED" in report["reason"]

    with_api(config(tmp_path), body)


ROUTES: list[tuple[str, str, str]] = [  # method, path ({id}: a job of tenant acme), scope
    ("POST", "/api/v1/jobs", "jobs:write"),
    ("GET", "/api/v1/jobs", "jobs:read"),
    ("GET", "/api/v1/jobs/{id}", "jobs:read"),
    ("POST", "/api/v1/jobs/{id}/cancel", "jobs:write"),
    ("GET", "/api/v1/jobs/{id}/trace", "jobs:read"),
    ("GET", "/api/v1/jobs/{id}/report", "jobs:read"),
    ("GET", "/api/v1/jobs/{id}/wait?timeout_s=0", "jobs:read"),
    ("GET", "/api/v1/jobs/{id}/logs", "jobs:read"),
]


@pytest.mark.parametrize(("method", "path", "needed"), ROUTES)
def test_the_authorisation_matrix(tmp_path: Path, method: str, path: str, needed: str) -> None:
    async def body(api: Api) -> None:
        job_id = (await api.submit()).json()["job"]["id"]
        url = path.replace("{id}", job_id)
        payload = {"command": ["true"]} if path == "/api/v1/jobs" else None

        async def call(who: str | None, headers: dict[str, str] | None = None) -> httpx.Response:
            return await api.client.request(
                method, url, json=payload, headers=headers or api.auth(who)
            )

        assert_problem(await call(None), 401, "unauthenticated")
        assert_problem(
            await call(None, {"Authorization": "Bearer crl_nope_nope"}), 401, "unauthenticated"
        )
        assert_problem(await call("approver"), 403, "not_permitted")
        if "{id}" in path:
            other = await call("other")
            data = assert_problem(other, 404, "not_found")
            missing = await api.client.request(
                method, path.replace("{id}", "0" * 26), json=payload, headers=api.auth("writer")
            )
            assert assert_problem(missing, 404, "not_found")["detail"] == data["detail"].replace(
                job_id, "0" * 26
            )
        right = await call("writer" if needed == "jobs:write" else "reader")
        assert right.status_code in (200, 201), right.text
        assert (await call("admin")).status_code in (200, 201, 409)

    with_api(config(tmp_path), body)


def test_bad_input_and_unknown_routes_are_problems_too(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        h = api.auth("writer")
        r = await api.client.post("/api/v1/jobs", json={"command": ["x"], "priority": 9}, headers=h)
        assert "priority" in assert_problem(r, 422, "invalid_request")["detail"]
        r = await api.client.post("/api/v1/jobs", json={"bogus": 1}, headers=h)
        assert_problem(r, 422, "invalid_request")
        r = await api.client.post("/api/v1/jobs", json={}, headers=h)  # no command nor prompt
        assert_problem(r, 422, "invalid_request")
        assert_problem(await api.client.get("/nowhere", headers=h), 404, "not_found")
        r = await api.client.delete("/api/v1/jobs", headers=h)
        assert_problem(r, 405, "method_not_allowed")
        assert r.headers["Allow"] == "GET, POST"  # every method of the path
        for junk in (b"{not json", b"\xff\xfe{"):  # bad JSON: 422; bytes that are no text: 400
            r = await api.client.post(
                "/api/v1/jobs", content=junk, headers={**h, "Content-Type": "application/json"}
            )
            said = assert_problem(r, r.status_code, "invalid_request")
            assert (r.status_code, said["title"]) in (
                (400, "Bad Request"),
                (422, "Unprocessable Content"),
            )

    with_api(config(tmp_path), body)


def test_a_body_over_the_limit_is_413_before_it_is_read_whole(tmp_path: Path) -> None:
    """Said by its Content-Length or streamed without one, a body over MAX_BODY_BYTES is a
    problem, with a token or without; the largest valid submission still goes through."""
    over = MAX_BODY_BYTES + 1
    read: list[int] = []

    async def stream() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse by
        chunk = b" " * (1 << 16)
        for _ in range(4 * over // len(chunk)):  # four times the limit, unless stopped
            read.append(len(chunk))
            yield chunk

    async def body(api: Api) -> None:
        json_h = {"Content-Type": "application/json"}
        for who in ("writer", None):
            r = await api.client.post(
                "/api/v1/jobs", content=b" " * over, headers={**api.auth(who), **json_h}
            )
            assert_problem(r, 413, "content_too_large")
        r = await api.client.post(
            "/api/v1/jobs", content=stream(), headers={**api.auth("writer"), **json_h}
        )
        assert_problem(r, 413, "content_too_large")
        assert sum(read) <= MAX_BODY_BYTES + (1 << 17)  # stopped at the limit, not the end
        arg = "\u0001" * (bounds.MAX_PROMPT_BYTES // 2)  # six bytes of JSON a character
        r = await api.client.post(
            "/api/v1/jobs", json={"command": ["echo", arg]}, headers=api.auth("writer")
        )
        assert len(r.request.content) > 1 << 20
        assert r.status_code == 201, r.text[:300]

    with_api(config(tmp_path), body)


def test_health_needs_no_token_and_openapi_and_docs_are_served(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        assert (await api.client.get("/healthz")).json() == {
            "status": "ok",
            "store": None,
            "engine": None,
        }
        ready = await api.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["engine"] == "not answering"
        spec = (await api.client.get("/openapi.json")).json()
        assert "/api/v1/jobs/{job_id}/cancel" in spec["paths"]
        page = await api.client.get("/docs")
        assert page.status_code == 200 and "/openapi.json" in page.text
        assert "cdn" not in page.text.lower() and "https://" not in page.text

    with_api(config(tmp_path), body)


async def dead_letter(api: Api, who: str = "writer") -> str:
    """A job of `who`'s tenant whose only attempt failed into the dead-letter queue."""
    job_id: str = (await api.submit(who)).json()["job"]["id"]
    won = await api.store.start_attempts([claim(await api.store.get_job(job_id))], now=NOW)
    await api.store.finish(
        [ending(won[0].attempt, JobState.DEAD_LETTERED, exit_code=1)], now=NOW + 3
    )
    return job_id


def test_the_dead_letter_queue_of_a_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        mine, second, theirs = (
            await dead_letter(api),
            await dead_letter(api),
            await dead_letter(api, "other"),
        )
        h = api.auth("writer")
        listed = (await api.client.get("/api/v1/dlq", headers=h)).json()["jobs"]
        assert [j["id"] for j in listed] == [second, mine]
        assert_problem(
            await api.client.get("/api/v1/dlq", headers=api.auth("approver")), 403, "not_permitted"
        )
        assert_problem(
            await api.client.post(f"/api/v1/dlq/{theirs}/requeue", headers=h), 404, "not_found"
        )
        r = await api.client.post(f"/api/v1/dlq/{mine}/requeue", headers=h)
        assert r.status_code == 201 and r.json()["requeued_from"] == mine
        assert_problem(
            await api.client.post("/api/v1/dlq/purge", json={"jobs": [theirs]}, headers=h),
            404,
            "not_found",
        )
        assert_problem(
            await api.client.post("/api/v1/dlq/purge", json={}, headers=h), 422, "invalid_request"
        )
        r = await api.client.post("/api/v1/dlq/purge", json={"all": True}, headers=h)
        assert r.json() == {"purged": [second]}
        other = await api.client.get("/api/v1/dlq", headers=api.auth("other"))
        assert [j["id"] for j in other.json()["jobs"]] == [theirs]

    with_api(config(tmp_path, CONFIG.replace("max_queued: 3", "max_queued: 30")), body)
