"""Scrape latency of `corral metrics` with 100,000 jobs in a SQLite store.

    .venv/bin/python bench/metrics.py [--jobs 100000] [--scrapes 50] [--out FILE]

Fills a fresh store (in a temporary directory) with `--jobs` jobs, most terminal with one
attempt (one in ten retried once), some queued and dead-lettered, 256 running, plus one agent event
and two tool-call evaluations per hundred jobs, written with plain INSERTs in the store's own
column order (store/rows.py) so the filling takes seconds. Then times `--scrapes` full scrapes
(`trace.metrics.exposition`: every aggregate query, the governance reads and the rendering; no
engine answers) once the settled attempts are folded into the store's rollups, and prints
p50/p99/max in ms. Target: p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from corral.domain.ids import new_id
from corral.store.rows import ATTEMPT_COLUMNS, JOB_COLUMNS
from corral.store.sqlite import SqliteStore
from corral.trace import metrics

LIVE = 256  # attempts running at once: a large fleet's concurrency
FOLDS = 8  # enough scrapes to fold 110,000 settled attempts, FOLD_BATCH at a time
ROLES = ("coder", "review", "triage", "ops")
STATES = ("SUCCEEDED",) * 6 + ("FAILED", "QUEUED", "RUNNING", "DEAD_LETTERED")


def _job_row(i: int, now: float, state: str) -> dict[str, object]:
    role = ROLES[i % len(ROLES)]
    at = now - 86400 + i * 0.5
    return {
        "id": new_id(int(at * 1000)),
        "state": state,
        "role": role,
        "worker": "claude" if i % 2 else "command",
        "env_name": "local",
        "priority": i % 3,
        "tenant": f"t{i % 5}",
        "command": "[]",
        "prompt": None,
        "cwd": None,
        "env": "{}",
        "options": "{}",
        "max_attempts": 4,
        "timeout_s": 600.0,
        "grace_s": 10.0,
        "idem_key": None,
        "dedup": "coalesce",
        "workspace": None,
        "parent_id": None,
        "depth": 0,
        "created_at": at,
        "updated_at": at + 5,
        "sort_at": at,
        "retry_at": None,
        "attempts": 0 if state == "QUEUED" else 1,
        "deps_pending": 0,
        "after_ids": "[]",
        "last_error": None,
        "exit_code": None,
        "limit_hit": None,
        "cancel_requested": None,
        "stop_kind": None,
        "requeued_from": None,
        "dlq_resolution": None,
        "lease_owner": None,
        "lease_until": None,
        "max_tool_calls": 50,
        "token_budget_in": 100000,
        "token_budget_out": 10000,
    }


def _attempt_row(job: dict[str, object], idx: int, state: str) -> dict[str, object]:
    start = float(job["created_at"]) + random.uniform(0.05, 3.0)  # type: ignore[arg-type]
    ended = None if state == "RUNNING" else start + random.uniform(0.1, 120.0)
    return {
        "id": new_id(),
        "job_id": job["id"],
        "idx": idx,
        "state": state,
        "permit_id": new_id(),
        "permit": "{}",
        "deadline_at": start + 600,
        "created_at": start,
        "dir": "/tmp/x",
        "engine_id": "bench",
        "pid": None,
        "started_at": start,
        "ended_at": ended,
        "exit_code": 0,
        "signal": None,
        "outcome": None if ended is None else "exited",
        "error": None,
        "limit_hit": None,
        "role": job["role"],
        "submitted_at": job["created_at"],
    }


def insert_rows(
    conn: sqlite3.Connection,
    jobs: Sequence[dict[str, object]],
    attempts: Sequence[dict[str, object]] = (),
) -> None:
    """Job and attempt rows (as `_job_row` and `_attempt_row` make them) with plain INSERTs in
    the store's own column order."""
    conn.executemany(
        f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES ({', '.join('?' * len(JOB_COLUMNS))})",
        [tuple(j[c] for c in JOB_COLUMNS) for j in jobs],
    )
    columns = (*ATTEMPT_COLUMNS, "role", "submitted_at")  # as store/sql.py writes them
    conn.executemany(
        f"INSERT INTO attempts ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        [tuple(a[c] for c in columns) for a in attempts],
    )


def fill(path: Path, n: int) -> None:
    now = time.time()
    jobs, attempts, events, evals = [], [], [], []
    running = 0
    for i in range(n):
        state = STATES[i % len(STATES)]
        if state == "RUNNING":  # live attempts are bounded by the fleet's concurrency
            running += 1
            state = "RUNNING" if running <= LIVE else "FAILED"
        job = _job_row(i, now, state)
        jobs.append(job)
        if state != "QUEUED":
            if i % 10 == 0:
                attempts.append(_attempt_row(job, 1, "FAILED"))  # retried once
            last = {"RUNNING": "RUNNING", "SUCCEEDED": "SUCCEEDED"}.get(state, "FAILED")
            attempts.append(_attempt_row(job, 2 if i % 10 == 0 else 1, last))
        if i % 100 == 0:
            events.append((new_id(), job["id"], 1, now, 1000, 200, 0.01, "{}"))
            evals += [
                (now, job["id"], 1, "tool_call", "Bash", "allow", "allowed", "", "{}"),
                (now, job["id"], 1, "tool_call", "Bash", "deny", "out_of_scope", "", "{}"),
            ]
    conn = sqlite3.connect(path)
    with conn:
        insert_rows(conn, jobs, attempts)
        conn.executemany(
            "INSERT INTO agent_events (event_id, job_id, attempt, at, tokens_in, "
            "tokens_out, cost_usd, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            events,
        )
        conn.executemany(
            "INSERT INTO policy_evaluations (at, job_id, attempt, stage, subject, "
            "verdict, reason, message, inputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            evals,
        )
    conn.execute("ANALYZE")
    conn.close()


async def scrape_times(path: Path, scrapes: int) -> list[float]:
    store = SqliteStore(path)
    await store.open()
    try:
        # The first scrapes fold the settled attempts into the rollups (store/metrics_sql.py,
        # FOLD_BATCH a scrape), as they would on a store that existed before migration 0016;
        # what is timed is the steady state after it.
        for _ in range(FOLDS):
            await metrics.exposition(store)
        times = []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            await metrics.exposition(store)
            times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        await store.close()


async def migrate(path: Path) -> None:
    """A fresh store at `path` with every migration applied."""
    store = SqliteStore(path)
    await store.open()
    await store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-metrics-") as tmp:
        path = Path(tmp) / "corral.db"
        asyncio.run(migrate(path))
        t0 = time.perf_counter()
        fill(path, args.jobs)
        filled = time.perf_counter() - t0
        times = sorted(asyncio.run(scrape_times(path, args.scrapes)))
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    result = {
        "jobs": args.jobs,
        "scrapes": len(times),
        "fill_s": round(filled, 2),
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(times[-1], 2),
        "target_p99_ms": 100,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if p99 < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
