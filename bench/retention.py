"""Retention on a SQLite store: how fast `corral gc` collects, and what it costs the writes the
engine makes meanwhile.

    .venv/bin/python bench/retention.py [--jobs 10000] [--out FILE]

Fills a fresh store (in a temporary directory) with `--jobs` terminal jobs past retention, each
with one attempt, five timeline records and its run report, written with plain INSERTs (the
chain's hashes are placeholders: collection does not check them). Then, in one event loop as in
the engine, it times submissions (a write transaction like the dispatcher's) for a few seconds
alone (the baseline), and again while retention collects every job; it reports the collection's
throughput, how long each batch's delete transaction held the write lock, and the submissions'
p50/p99 under collection as a ratio to the baseline of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral.config import load
from corral.core.ports import GcBatch
from corral.domain.ids import new_id
from corral.runtime import retention
from corral.store.rows import ATTEMPT_COLUMNS, JOB_COLUMNS, job_from_row
from corral.store.sqlite import SqliteStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.metrics import _attempt_row, _job_row

BASELINE_S = 3.0
EVENTS = 5  # timeline records per job
REPORT_COLUMNS = (
    "id, seq, job_id, role, tenant, workflow, outcome, attempts, steps, tool_calls, tokens_in,"
    " tokens_out, cost_usd, started_at, ended_at, duration_ms, summary, created_at, metrics,"
    " prev_hash, hash"
)


def fill(path: Path, n: int, now: float) -> None:
    import sqlite3

    jobs, attempts, events, reports = [], [], [], []
    seq = 0
    for i in range(n):
        job = _job_row(i, now - 60 * 86400, "SUCCEEDED")
        jobs.append(job)
        attempts.append(_attempt_row(job, 1, "ENDED"))
        for k in range(EVENTS):
            seq += 1
            at = float(job["created_at"]) + k  # type: ignore[arg-type]
            events.append((job["id"], at, "event", None, None, 1, "", "{}", seq, "x", "x"))
        reports.append(
            (
                new_id(),
                i + 1,
                job["id"],
                job["role"],
                job["tenant"],
                None,
                "success",
                1,
                1,
                0,
                0,
                0,
                0.0,
                None,
                now,
                None,
                "",
                now,
                "{}",
                "x",
                "x",
            )
        )
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES "
            f"({', '.join('?' * len(JOB_COLUMNS))})",
            [tuple(j[c] for c in JOB_COLUMNS) for j in jobs],
        )
        columns = (*ATTEMPT_COLUMNS, "role", "submitted_at")
        conn.executemany(
            f"INSERT INTO attempts ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            [tuple(a[c] for c in columns) for a in attempts],
        )
        conn.executemany(
            "INSERT INTO job_events (job_id, at, kind, from_state, to_state, attempt, message,"
            " data, seq, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            events,
        )
        conn.executemany(
            f"INSERT INTO run_reports ({REPORT_COLUMNS}) VALUES ({', '.join('?' * 21)})",
            reports,
        )
        conn.execute(
            "INSERT INTO audit_heads (chain, seq, hash) VALUES ('job_events', ?, 'x')"
            " ON CONFLICT (chain) DO UPDATE SET seq = excluded.seq",
            (seq,),
        )
        conn.execute(
            "INSERT INTO audit_heads (chain, seq, hash) VALUES ('run_reports', ?, 'x')"
            " ON CONFLICT (chain) DO UPDATE SET seq = excluded.seq",
            (n,),
        )
    conn.execute("ANALYZE")
    conn.close()


def _queued(i: int) -> Any:
    """A fresh QUEUED job (what a submission writes)."""
    row = _job_row(i, time.time(), "QUEUED")
    row["created_at"] = row["updated_at"] = row["sort_at"] = time.time()
    row["id"] = new_id()
    return job_from_row(row)


async def _submits(store: SqliteStore, until: Any) -> list[float]:
    """Submission latencies (ms) until `until()` is true."""
    times = []
    i = 0
    while not until():
        i += 1
        job = _queued(i)
        t0 = time.perf_counter()
        await store.submit(job, now=time.time(), aging_s=60.0)
        times.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.005)  # a dispatcher's pace, not a tight loop
    return times


def _p(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def run(tmp: Path, n: int) -> dict[str, Any]:
    (tmp / "corral.yaml").write_text("retention: {keep_days: 30, keep_jobs: 0, batch: 200}\n")
    cfg = load(data_dir=tmp / "data", config_path=tmp / "corral.yaml")
    path = cfg.db_path
    path.parent.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(path)
    await store.open()
    await store.close()
    t0 = time.perf_counter()
    fill(path, n, time.time())
    filled = time.perf_counter() - t0

    store = SqliteStore(path)
    await store.open()
    try:
        end = time.monotonic() + BASELINE_S
        baseline = await _submits(store, lambda: time.monotonic() > end)
        holds: list[float] = []
        remove = store.gc_remove

        async def timed(batch: GcBatch, **kw: Any) -> int:
            t = time.perf_counter()
            try:
                return await remove(batch, **kw)
            finally:
                holds.append((time.perf_counter() - t) * 1000)

        store.gc_remove = timed  # type: ignore[method-assign]
        t0 = time.perf_counter()
        gc = asyncio.ensure_future(retention.collect(store, cfg, holder="bench"))
        during = await _submits(store, gc.done)
        result = await gc
        took = time.perf_counter() - t0
    finally:
        await store.close()
    archived = sum(Path(a).stat().st_size for a in result.archives)
    return {
        "jobs": n,
        "fill_s": round(filled, 2),
        "collected": result.jobs,
        "batches": result.batches,
        "gc_s": round(took, 2),
        "jobs_per_s": round(result.jobs / took, 1),
        "archive_mb": round(archived / 1e6, 2),
        "delete_tx_ms": {
            "p50": round(statistics.median(holds), 2),
            "p99": round(_p(holds, 0.99), 2),
            "max": round(max(holds), 2),
        },
        "submit_ms_baseline": {
            "p50": round(statistics.median(baseline), 2),
            "p99": round(_p(baseline, 0.99), 2),
            "n": len(baseline),
        },
        "submit_ms_during_gc": {
            "p50": round(statistics.median(during), 2),
            "p99": round(_p(during, 0.99), 2),
            "n": len(during),
        },
        "submit_p99_ratio": round(_p(during, 0.99) / _p(baseline, 0.99), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-retention-") as tmp:
        result = asyncio.run(run(Path(tmp), args.jobs))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["collected"] == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
