"""`/mcp` on the HTTP app in process (the app's lifespan runs the MCP transport; the real `mcp`
client over an ASGI transport): the bearer token decides who calls — none or a bad one is a 401
problem, the token's rate limit applies, its tenant and scopes reach the tools."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from corral.api import create_app
from corral.core.ports import JobQuery
from corral.services import tokens
from corral.store.memory import MemoryStore
from tests.unit.test_api_jobs import config

PROBLEM = "application/problem+json"
LIMITED = """\
api: {rate_limit: {per_s: 0.001, burst: 3}}
"""


@asynccontextmanager
async def mcp_over(app: object, token: str) -> AsyncIterator[Client]:
    transport = httpx2.ASGITransport(app=app)  # type: ignore[arg-type]
    async with (
        httpx2.AsyncClient(
            transport=transport,
            base_url="http://test",
            headers={"Authorization": f"Bearer {token}"},
        ) as http,
        Client(streamable_http_client("http://test/mcp", http_client=http)) as client,
    ):
        yield client


def test_tokens_decide_the_caller(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        acme = (await tokens.create(store, tenant="acme", scopes="jobs:read", by="t")).text
        app = create_app(config(tmp_path), store, wake=lambda op: None)
        async with app.router.lifespan_context(app):
            raw = httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url="http://test"
            )
            async with raw:
                for headers in (
                    {},
                    {"Authorization": "Bearer crl_no_such"},
                    {"Authorization": acme},
                ):
                    r = await raw.post("/mcp", json={}, headers=headers)
                    assert r.status_code == 401, r.text
                    assert r.headers["content-type"] == PROBLEM
                    assert r.json()["code"] == "unauthenticated"
                    assert r.headers["www-authenticate"] == "Bearer"
                spec = (await raw.get("/openapi.json")).json()
                assert "/mcp" not in spec["paths"]
            async with mcp_over(app, acme) as c:
                listed = await c.call_tool("list_jobs", {})
                assert not listed.is_error and listed.structured_content == {
                    "jobs": [],
                    "next_cursor": None,
                }
                state = await c.call_tool("cluster_state", {})
                assert state.structured_content["tenant"] == "acme"
                refused = await c.call_tool("submit_job", {"command": ["true"]})
                assert refused.is_error
                assert refused.structured_content["needed_scope"] == "jobs:write"
            assert await store.list_jobs(JobQuery(limit=100)) == []

    anyio.run(main)


def test_the_tokens_rate_limit_applies(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        text = (await tokens.create(store, tenant="acme", scopes="jobs:read", by="t")).text
        app = create_app(config(tmp_path, LIMITED), store, wake=lambda op: None)
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app),
                base_url="http://test",
                headers={"Authorization": f"Bearer {text}", "Accept": "application/json"},
            ) as raw,
        ):
            statuses = []
            for _ in range(5):
                r = await raw.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                statuses.append(r.status_code)
            assert statuses[-1] == 429 and int(r.headers["retry-after"]) >= 1
            assert r.json()["code"] == "rate_limited"
            assert statuses.count(429) == 2  # the burst of 3 went through

    anyio.run(main)
