"""What asking Corral through its MCP server costs, against the same question over REST.

    .venv/bin/python bench/mcp_tools.py [--jobs 500] [--calls 300] [--out FILE]

Fills a fresh SQLite store (temporary directory) with `--jobs` jobs of one tenant through the
submission service, then asks for one job's status `--calls` times, one call after another, in
one process and in the same run, three ways:

- `rest`: `GET /api/v1/jobs/{id}` on the HTTP app (httpx over ASGI, no socket): the baseline;
- `mcp_http`: the `job_status` tool at `/mcp` on the same app (the `mcp` client over ASGI:
  stateless streamable HTTP, a bearer token per request);
- `mcp_memory`: the same tool with the client connected in memory (the protocol without HTTP).

It also times `list_jobs` (20 per page) and `cluster_state` (reads every waiting job) over
`/mcp`. Prints calls per second and p50/p99 per way, and the ratio mcp_http / rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from corral.api import create_app
from corral.config import load
from corral.mcp import Caller, build_server, fixed
from corral.runtime.assembly import build_store
from corral.services import tokens
from corral.services.submissions import SubmitRequest, submit


async def timed(calls: int, one: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    await one()  # warm
    lat = []
    start = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        await one()
        lat.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - start
    lat.sort()
    return {
        "calls_per_s": round(calls / wall, 1),
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3),
    }


async def main(jobs: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "corral.yaml").write_text(
            "scheduler: {max_queued: 100000}\napi: {rate_limit: {per_s: 100000, burst: 100000}}\n"
        )
        cfg = load(data_dir=root / "data", config_path=root / "corral.yaml")
        store = build_store(cfg)
        await store.open()
        try:
            ids = [
                (
                    await submit(
                        store, cfg, SubmitRequest(command=("true",), tenant="acme"), lambda op: None
                    )
                ).result.job.id
                for _ in range(jobs)
            ]
            job = ids[len(ids) // 2]
            text = (await tokens.create(store, tenant="acme", scopes="jobs:read", by="bench")).text
            auth = {"Authorization": f"Bearer {text}"}
            app = create_app(cfg, store, wake=lambda op: None)
            out: dict[str, Any] = {"jobs": jobs, "calls": calls}
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://b", headers=auth
                ) as rest,
                httpx2.AsyncClient(
                    transport=httpx2.ASGITransport(app=app), base_url="http://b", headers=auth
                ) as h2,
                Client(streamable_http_client("http://b/mcp", http_client=h2)) as over_http,
                Client(
                    build_server(
                        store, cfg, lambda op: None, fixed(Caller("acme", ("jobs:read",), "b"))
                    )
                ) as in_memory,
            ):

                async def by_rest() -> None:
                    r = await rest.get(f"/api/v1/jobs/{job}")
                    assert r.status_code == 200, r.text

                async def by_tool(c: Client, tool: str, args: dict[str, Any]) -> None:
                    r = await c.call_tool(tool, args)
                    assert not r.is_error, r.content

                status = {"job_id": job}
                out["rest"] = await timed(calls, by_rest)
                out["mcp_http"] = await timed(
                    calls, lambda: by_tool(over_http, "job_status", status)
                )
                out["mcp_memory"] = await timed(
                    calls, lambda: by_tool(in_memory, "job_status", status)
                )
                out["mcp_http_list_jobs"] = await timed(
                    calls // 3, lambda: by_tool(over_http, "list_jobs", {"limit": 20})
                )
                out["mcp_http_cluster_state"] = await timed(
                    calls // 3, lambda: by_tool(over_http, "cluster_state", {})
                )
            out["ratio_mcp_http_to_rest"] = round(
                out["mcp_http"]["calls_per_s"] / out["rest"]["calls_per_s"], 3
            )
            return out
        finally:
            await store.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    result = anyio.run(main, a.jobs, a.calls)
    for way in ("rest", "mcp_http", "mcp_memory", "mcp_http_list_jobs", "mcp_http_cluster_state"):
        r = result[way]
        print(
            f"{way:<24} {r['calls_per_s']:>8} calls/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms"
        )
    print(f"mcp_http / rest: {result['ratio_mcp_http_to_rest']}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=2))
    sys.exit(0)
