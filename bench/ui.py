"""Render time of the dashboard's pages with 100,000 jobs in a SQLite store.

    .venv/bin/python bench/ui.py [--jobs 100000] [--learnings 10000] [--renders 30] [--out FILE]

Fills a fresh store the way bench/metrics.py does (100,000 jobs over five tenants, their
attempts, agent events and evaluations) and adds `--learnings` learnings over the same tenants
(each with its history, half of them given to a run: citations, rewards and the A/B arms the
knowledge pages read), makes an admin token of one tenant, signs in to the
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
from corral.domain.knowledge import (
    Arm,
    Citation,
    KnowledgeRun,
    Learning,
    LearningChange,
    LearningKind,
    LearningStatus,
    Maturity,
    Provenance,
    Tier,
)
from corral.services import tokens
from corral.store.sqlite import SqliteStore
from corral.trace import metrics

TARGET_MS = 150.0
TENANT = "t0"


TENANTS = 5  # as bench/metrics.py's filler
WORDS = [
    "pytest",
    "docker",
    "seed",
    "cache",
    "flaky",
    "timeout",
    "import",
    "migration",
    "lint",
    "retry",
]


async def learn(store: SqliteStore, n: int) -> str:
    """`n` learnings over the tenants, each with its creation line; every other one given to a
    run whose end rewarded it. The id of one of TENANT's (the detail page's)."""
    kinds, tiers = list(LearningKind), [Tier.GOLD, Tier.SILVER, Tier.BRONZE]
    shown = ""
    for i in range(n):
        tenant = f"t{i % TENANTS}"
        at = 1_700_000_000.0 + i
        x = Learning(
            id=f"lrn-{i:08d}",
            tenant=tenant,
            role=("coder", "review", "triage", "ops")[i % 4],
            kind=kinds[i % len(kinds)],
            title=f"{WORDS[i % 10]} and {WORDS[(i * 7) % 10]}: learning {i}",
            body=f"When `{WORDS[i % 10]}` fails in tests/test_{i}.py, check line {i % 90}.\n"
            f"- Run `{WORDS[(i * 3) % 10]}` again.",
            digest=f"d{i}",
            score=0.8,
            tier=tiers[i % 3],
            confidence=0.8,
            utility=0.5,
            maturity=Maturity.PROVISIONAL,
            status=LearningStatus.PENDING if i % 3 == 2 else LearningStatus.ACTIVE,
            provenance=Provenance(job_id=f"job-{i}", attempt=1, commit=None),
            created_at=at,
            updated_at=at,
        )
        change = LearningChange(learning_id=x.id, at=at, action="created", actor="bench")
        await store.add_learning(x, change)
        if tenant == TENANT and not shown:
            shown = x.id
        if i % 2 == 0:
            job = f"run-{i}"
            arm = Arm.WITH if i % 4 == 0 else Arm.WITHOUT
            run = KnowledgeRun(
                job_id=job,
                attempt=1,
                tenant=tenant,
                role=x.role,
                arm=arm,
                reason="bench",
                injected=1 if arm is Arm.WITH else 0,
                started_at=at,
            )
            cites = [Citation(learning_id=x.id, job_id=job, attempt=1, at=at, rank=1, score=1.0)]
            await store.record_injection(run, cites if arm is Arm.WITH else [])
            await store.settle_run(
                job, succeeded=i % 3 != 0, tool_calls=i % 7, reward=0.8, updates=[]
            )
    return shown


def _p(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def measure(tmp: Path, renders: int, learnings: int) -> dict[str, list[float]]:
    store = SqliteStore(tmp / "corral.db")
    await store.open()
    try:
        learning = await learn(store, learnings)
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
                "knowledge": "/ui/knowledge",
                "knowledge, search": "/ui/knowledge?q=flaky+pytest+timeout",
                "knowledge, filters": "/ui/knowledge?type=failure&tier=gold&status=active",
                "learning detail": f"/ui/knowledge/{learning}",
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
    ap.add_argument("--learnings", type=int, default=10_000)
    ap.add_argument("--renders", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-ui-") as tmp_name:
        tmp = Path(tmp_name)
        asyncio.run(migrate(tmp / "corral.db"))
        fill(tmp / "corral.db", args.jobs)
        with sqlite3.connect(tmp / "corral.db") as conn:  # metrics.py's filler says only "ended"
            conn.execute("UPDATE attempts SET state = 'SUCCEEDED' WHERE state = 'ENDED'")
        times = asyncio.run(measure(tmp, args.renders, args.learnings))
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
    print(f"{args.jobs} jobs, {args.learnings} learnings, {args.renders} renders per page (ms)")
    for name, r in rows.items():
        print(
            f"  {name:<28} p50 {r['p50_ms']:7.1f}  p99 {r['p99_ms']:7.1f}  "
            f"max {r['max_ms']:7.1f}  ×baseline {r['x_baseline_p50']:.2f}"
        )
    slow = [n for n, r in rows.items() if n[0].islower() and r["p99_ms"] >= TARGET_MS]
    if args.out:
        summary = {
            "jobs": args.jobs,
            "learnings": args.learnings,
            "pages": rows,
            "target_ms": TARGET_MS,
            "over": slow,
        }
        args.out.write_text(json.dumps(summary, indent=2))
    if slow:
        print(f"over the {TARGET_MS:.0f} ms target: {', '.join(slow)}", file=sys.stderr)
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
