"""Render time of the dashboard's pages with 100,000 jobs in a SQLite store.

    .venv/bin/python bench/ui.py [--jobs 100000] [--renders 30] [--out FILE]

Fills a fresh store the way bench/metrics.py does (100,000 jobs over five tenants, their
attempts, agent events and evaluations), makes an admin token of one tenant, signs in to the
dashboard in process (httpx ASGITransport over `create_app` with the dashboard mounted, so the
timing covers routing, the services' reads and the template rendering, not a socket) and times
`--renders` GETs of each page. As a baseline in the same run it times `GET /healthz` (a request
through the same stack that reads nothing), and for comparison the HTTP API's `GET
/api/v1/jobs`. Prints p50/p99/max in ms per page and the ratio of each page's p50 to the
baseline's. Target: every dashboard page's p99 < 150 ms (exit code 1 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from metrics import FOLDS, fill, migrate  # bench/metrics.py, beside this file

from corral import ui
from corral.api import create_app
from corral.config import load
from corral.core.ports import JobQuery
from corral.services import tokens
from corral.store.sqlite import SqliteStore
from corral.trace import metrics

TARGET_MS = 150.0
TENANT = "t0"


def _p(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def measure(tmp: Path, renders: int) -> dict[str, list[float]]:
    store = SqliteStore(tmp / "corral.db")
    await store.open()
    try:
        for _ in range(FOLDS):  # fold the settled attempts into the rollups first
            await metrics.exposition(store)
        (tmp / "corral.yaml").write_text("roles: {coder: {}, review: {}, triage: {}, ops: {}}\n")
        cfg = load(data_dir=tmp / "data", config_path=tmp / "corral.yaml")
        text = (await tokens.create(store, tenant=TENANT, scopes="admin", by="bench")).text
        app = create_app(cfg, store, wake=lambda op: None, ui=ui.mount)
        one = next(j for j in await store.list_jobs(JobQuery(limit=10)) if j.tenant == TENANT)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            form = await client.get("/ui/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf, "no CSRF field on the sign-in form"
            r = await client.post("/ui/login", data={"token": text, "csrf": csrf.group(1)})
            assert r.status_code == 303, r.text
            pages = {
                "Baseline: GET /healthz": "/healthz",
                "API: GET /api/v1/jobs": "/api/v1/jobs",
                "overview": "/ui/",
                "overview (live part)": "/ui/fragments/overview",
                "jobs": "/ui/jobs",
                "jobs, state filter": "/ui/jobs?state=FAILED",
                "jobs, text search": "/ui/jobs?q=nothing-matches",
                "job detail": f"/ui/jobs/{one.id}",
                "approvals": "/ui/approvals",
                "environments": "/ui/environments",
                "runs": "/ui/runs",
            }
            auth = {"Authorization": f"Bearer {text}"}
            times: dict[str, list[float]] = {k: [] for k in pages}
            for _ in range(renders):
                for name, path in pages.items():
                    t0 = time.perf_counter()
                    got = await client.get(path, headers=auth if path.startswith("/api") else {})
                    times[name].append((time.perf_counter() - t0) * 1000)
                    assert got.status_code == 200, (path, got.status_code, got.text[:300])
            return times
    finally:
        await store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--renders", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-ui-") as tmp_name:
        tmp = Path(tmp_name)
        asyncio.run(migrate(tmp / "corral.db"))
        fill(tmp / "corral.db", args.jobs)
        with sqlite3.connect(tmp / "corral.db") as conn:  # metrics.py's filler says only "ended"
            conn.execute("UPDATE attempts SET state = 'SUCCEEDED' WHERE state = 'ENDED'")
        times = asyncio.run(measure(tmp, args.renders))
    base = statistics.median(times["Baseline: GET /healthz"])
    rows = {
        name: {
            "p50_ms": round(statistics.median(t), 1),
            "p99_ms": round(_p(t, 0.99), 1),
            "max_ms": round(max(t), 1),
            "x_baseline_p50": round(statistics.median(t) / base, 2),
        }
        for name, t in times.items()
    }
    print(f"{args.jobs} jobs, {args.renders} renders per page (ms)")
    for name, r in rows.items():
        print(
            f"  {name:<28} p50 {r['p50_ms']:7.1f}  p99 {r['p99_ms']:7.1f}  "
            f"max {r['max_ms']:7.1f}  ×baseline {r['x_baseline_p50']:.2f}"
        )
    slow = [n for n, r in rows.items() if n[0].islower() and r["p99_ms"] >= TARGET_MS]
    if args.out:
        summary = {"jobs": args.jobs, "pages": rows, "target_ms": TARGET_MS, "over": slow}
        args.out.write_text(json.dumps(summary, indent=2))
    if slow:
        print(f"over the {TARGET_MS:.0f} ms target: {', '.join(slow)}", file=sys.stderr)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
