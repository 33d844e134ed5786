"""Corral's MCP server through the real `mcp` client: `corral mcp` spawned over stdio against a
data directory with jobs, and `/mcp` on a live `corral serve` on loopback with bearer tokens —
tools listed and called, a token of one tenant blind to another's jobs, a read-only caller
unable to submit, no token a 401 (docs/how-to/mcp.md)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.acceptance.conftest import CORRAL, Corral
from tests.acceptance.test_http_api import live

TOOLS = {
    "job_status",
    "list_jobs",
    "job_trace_summary",
    "cluster_state",
    "queue_depth",
    "submit_job",
    "world_model",
}


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


def error(result: Any) -> dict[str, Any]:
    assert result.is_error, result.structured_content
    data: dict[str, Any] = result.structured_content
    return data


@asynccontextmanager
async def stdio(c: Corral, *args: str, token: str | None = None) -> AsyncIterator[Client]:
    env = {**c.env(), **({"CORRAL_TOKEN": token} if token else {})}
    env.pop("CORRAL_JOB_ID", None)
    params = StdioServerParameters(command=CORRAL, args=["mcp", *args], env=env, cwd=c.work)
    async with Client(params) as client:
        yield client


@asynccontextmanager
async def http(url: str, token: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as h,
        Client(streamable_http_client(f"{url}/mcp", http_client=h)) as client,
    ):
        yield client


def run(body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body)


def test_stdio_serves_the_local_user_or_a_tokens_tenant(corral: Corral) -> None:
    mine = corral.submit("sh", "-c", "echo mine")
    theirs = corral.submit("true", opts=("--tenant", "globex"))
    corral.drain()
    reader = corral.ok("token", "create", "--tenant", "globex", "--scopes", "jobs:read").strip()

    async def body() -> None:
        async with stdio(corral) as local:  # the local user: the default tenant, read + write
            assert {t.name for t in (await local.list_tools()).tools} == TOOLS
            assert ok(await local.call_tool("job_status", {"job_id": mine}))["state"] == "SUCCEEDED"
            listed = ok(await local.call_tool("list_jobs", {}))["jobs"]
            assert [j["id"] for j in listed] == [mine]  # not globex's job
            assert error(await local.call_tool("job_status", {"job_id": theirs}))["error"] == (
                "not_found"
            )
            summary = ok(await local.call_tool("job_trace_summary", {"job_id": mine}))
            assert summary["attempts"] == 1 and summary["tool_calls"] == 0
            cluster = ok(await local.call_tool("cluster_state", {}))
            assert cluster["environments"][0]["max_inflight"] == 8
            assert cluster["engine_serving"] is False
            assert ok(await local.call_tool("queue_depth", {}))["queued"] == 0
            made = ok(
                await local.call_tool("submit_job", {"command": ["true"], "idempotency_key": "a"})
            )
            assert made["created"] and made["job"]["tenant"] == "default"
            assert made["engine_serving"] is False
            depth = ok(await local.call_tool("queue_depth", {"job_id": made["job"]["id"]}))
            assert depth["queued"] == 1 and depth["placement"]["queue_position"] == 0

        async with stdio(corral, "--read-only") as ro:
            refused = error(await ro.call_tool("submit_job", {"command": ["true"]}))
            assert refused["needed_scope"] == "jobs:write"

        async with stdio(corral, token=reader) as g:  # a token's tenant and scopes
            assert [j["id"] for j in ok(await g.call_tool("list_jobs", {}))["jobs"]] == [theirs]
            assert error(await g.call_tool("job_status", {"job_id": mine}))["error"] == "not_found"
            assert error(await g.call_tool("submit_job", {"command": ["true"]}))["error"] == (
                "not_permitted"
            )

    run(body)
    # the job submitted through MCP is an ordinary job, queued for the engine
    assert [j["state"] for j in corral.json("jobs") if j["key"] == "a"] == ["QUEUED"]
    bad = corral.run("mcp", "--token", "crl_nope_nope")
    assert bad.returncode == 10 and "invalid, expired or revoked" in bad.stderr
    assert "Traceback" not in bad.stderr
    usage = corral.ok("mcp", "--help")
    assert '{"mcpServers": {"corral": {"command": "corral",' in usage and "--read-only" in usage


def test_http_mcp_with_bearer_tokens_on_a_live_engine(corral: Corral) -> None:
    url, acme = live(corral)  # acme: jobs:read, jobs:write, approve, govern
    reader = corral.ok("token", "create", "--tenant", "acme", "--scopes", "jobs:read").strip()
    globex = corral.ok("token", "create", "--tenant", "globex", "--scopes", "jobs:read").strip()

    anon = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert anon.status_code == 401 and anon.headers["www-authenticate"] == "Bearer"
    assert anon.headers["content-type"] == "application/problem+json"
    wrong = httpx.post(f"{url}/mcp", json={}, headers={"Authorization": "Bearer crl_x_y"})
    assert wrong.status_code == 401

    async def body() -> None:
        async with http(url, acme) as a:
            assert {t.name for t in (await a.list_tools()).tools} == TOOLS
            made = ok(await a.call_tool("submit_job", {"command": ["sh", "-c", "echo over-mcp"]}))
            job = made["job"]["id"]
            assert made["job"]["tenant"] == "acme" and made["engine_serving"] is True
            # the engine's own long poll, not a loop of status calls
            assert await anyio.to_thread.run_sync(lambda: corral.wait(job, timeout=60)) == 0
            assert ok(await a.call_tool("job_status", {"job_id": job}))["state"] == "SUCCEEDED"
            assert [j["id"] for j in ok(await a.call_tool("list_jobs", {}))["jobs"]] == [job]
            assert ok(await a.call_tool("job_trace_summary", {"job_id": job}))["attempts"] == 1
            state = ok(await a.call_tool("cluster_state", {}))
            assert state["engine_serving"] is True and state["tenant"] == "acme"
            assert ok(await a.call_tool("queue_depth", {}))["tenant_queued"] == 0
        async with http(url, reader) as r:
            refused = error(await r.call_tool("submit_job", {"command": ["true"]}))
            assert refused["error"] == "not_permitted" and refused["needed_scope"] == "jobs:write"
            assert ok(await r.call_tool("job_status", {"job_id": job}))["id"] == job
        async with http(url, globex) as g:
            assert ok(await g.call_tool("list_jobs", {}))["jobs"] == []
            for tool in ("job_status", "job_trace_summary", "queue_depth"):
                assert error(await g.call_tool(tool, {"job_id": job}))["error"] == "not_found"

    run(body)
    assert [j["state"] for j in corral.json("jobs")] == ["SUCCEEDED"]  # one job, no more
    assert os.environ.get("CORRAL_TOKEN") is None  # nothing leaked into the test's own env
