"""The dispatch scenarios of bench/run.py beside the workloads (the task):

- `LAT`: submit → RUNNING on an idle engine (p50/p99), against the bare loop's insert → spawned
  → RUNNING committed;
- `Q100K`: the same engine with 100 and with 100,000 jobs queued: the store's claim query, the
  engine's ms per job over its first 100 jobs, its peak RSS (and its core child's), and
  `corral jobs --json` (default page of 50) against the store;
- `CLI`: `corral jobs --json` on an empty store against `python -c pass` (the interpreter's own
  start), plus the import count of the command; and `corral show ID --json` with a
  configuration file, loaded from its cache against validated anew each time;
- `H100K`: W1's jobs (/bin/true, concurrency 8) on a store that already holds 100 and 100,000
  ended jobs with their run reports (a long-lived engine's history), with and without SQLite's
  statistics (ANALYZE): the engine's CPU per job and the rate, each against the small store.

Every figure has its baseline measured in the same run; bench/README.md says how to read them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from corral.config import Config
from corral.core.ports import Admission, QueueFilter
from corral.domain.governance import ReportOutcome, RunReport
from corral.domain.ids import new_id
from corral.domain.models import JobSpec
from corral.runtime.control import tell
from corral.services.submissions import submissions
from corral.store.sqlite import SqliteStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.metrics import _attempt_row, _job_row, insert_rows
from tests.contract.test_store_contract import make_job  # a QUEUED job, as bench/events.py

LAT_RUN_S = 0.1
LAT_COMMAND = ("sleep", str(LAT_RUN_S))  # long enough that RUNNING is recorded before the end
RSS_TARGET_MB = 300.0
CLI_TARGET_S = 0.15
FIRST_JOBS = 100  # Q100K: the engine's pace over its first this many jobs


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# --------------------------------------------------------------------------- CPU per job


def cpu_split_ms(corral_cpu: dict[str, float] | None, bare_cpu: dict[str, float] | None, n: int):
    """CPU ms per job by process: the engine, its core child, the shims (what was reaped in the
    engine's tree minus the jobs' own CPU) and the jobs (the bare loop's jobs, per job, in the
    same run: the same command), the submitter; and the bare loop's own and its jobs'."""
    if not corral_cpu or not bare_cpu or n <= 0:
        return None
    job = bare_cpu["jobs"] * 1000 / n
    reaped = corral_cpu.get("shims_and_jobs", 0.0) * 1000 / n
    out = {
        "engine": corral_cpu.get("engine", 0.0) * 1000 / n,
        "core": corral_cpu.get("core", 0.0) * 1000 / n,
        "shim": max(0.0, reaped - job),
        "job": job,
        "submitter": corral_cpu.get("submitter", 0.0) * 1000 / n,
        "bare_loop": bare_cpu["loop"] * 1000 / n,
        "bare_job": job,
    }
    out["corral_total"] = out["engine"] + out["core"] + out["shim"] + out["job"]
    out["bare_total"] = out["bare_loop"] + out["bare_job"]
    out["overhead_ratio"] = (
        (out["corral_total"] - job) / out["bare_loop"] if out["bare_loop"] else None
    )
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


# --------------------------------------------------------------------------- LAT


def _attempt_times(db: Path, job_id: str) -> tuple[float, float | None, float | None, str, float]:
    with sqlite3.connect(db, timeout=5) as conn:
        row = conn.execute(
            "SELECT j.created_at, a.created_at, a.started_at, j.state, j.updated_at FROM jobs j"
            " LEFT JOIN attempts a ON a.job_id = j.id WHERE j.id = ? ORDER BY a.idx LIMIT 1",
            (job_id,),
        ).fetchone()
    return float(row[0]), row[1], row[2], str(row[3]), float(row[4])


async def _corral_latency(cfg: Config, n: int) -> dict[str, list[float]]:
    store = SqliteStore(cfg.db_path)
    await store.open()
    svc = submissions(store, cfg)
    permit, running, ended = [], [], []
    try:
        for _ in range(n):
            job = (await svc.submit(JobSpec(command=LAT_COMMAND, cwd=str(cfg.data_dir)))).job
            tell(cfg.data_dir, "submitted")  # as `corral submit` does
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                created, claimed, started, state, updated = _attempt_times(cfg.db_path, job.id)
                if started is not None and state in ("SUCCEEDED", "FAILED"):
                    permit.append((claimed - created) * 1000)
                    running.append((started - created) * 1000)
                    ended.append((updated - created - LAT_RUN_S) * 1000)
                    break
                await anyio.sleep(0.01)
            await anyio.sleep(0.05)  # idle again
    finally:
        await store.close()
    return {"permit": permit, "running": running, "ended": ended}


async def _bare_latency(work: Path, n: int, env: dict[str, str]) -> dict[str, list[float]]:
    db = sqlite3.connect(work / "bare-lat.db", isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT, created_at REAL)")
    running: list[float] = []
    ended: list[float] = []
    for i in range(n):
        created = time.time()
        db.execute("INSERT INTO jobs VALUES (?, 'QUEUED', ?)", (f"j{i}", created))
        jdir = work / "lat" / f"j{i}"
        jdir.mkdir(parents=True)
        with open(jdir / "stdout.log", "ab") as o, open(jdir / "stderr.log", "ab") as e:
            proc = await asyncio.create_subprocess_exec(
                *LAT_COMMAND, stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env
            )
        db.execute("UPDATE jobs SET state = 'RUNNING' WHERE id = ?", (f"j{i}",))
        running.append((time.time() - created) * 1000)
        await proc.wait()
        db.execute("UPDATE jobs SET state = 'SUCCEEDED' WHERE id = ?", (f"j{i}",))
        ended.append((time.time() - created - LAT_RUN_S) * 1000)
        await asyncio.sleep(0.05)
    db.close()
    return {"running": running, "ended": ended}


def run_latency(
    work: Path, n: int, start_engine: Callable[[Config], Any], cfg: Config, env: dict[str, str]
) -> dict[str, Any]:
    """Submit one job at a time to an idle live engine and wait for its end; the bare loop
    does the same (insert, spawn, RUNNING committed)."""
    bare = asyncio.run(_bare_latency(work, n, env))
    engine = start_engine(cfg)
    try:
        engine.wait_ready()
        corral = anyio.run(_corral_latency, cfg, n)
    finally:
        engine.stop()
        engine.kill()
    row: dict[str, Any] = {"jobs": n, "command": " ".join(LAT_COMMAND)}
    for name, values in corral.items():
        row[f"{name}_p50_ms"] = round(pct(values, 50), 2)
        row[f"{name}_p99_ms"] = round(pct(values, 99), 2)
    row["baseline_p50_ms"] = round(pct(bare["running"], 50), 2)
    row["baseline_p99_ms"] = round(pct(bare["running"], 99), 2)
    # submit -> the job's end durable, less the command's own run: what a job costs end to end
    row["baseline_ended_p50_ms"] = round(pct(bare["ended"], 50), 2)
    row["ratio_p50"] = round(row["running_p50_ms"] / row["baseline_p50_ms"], 2)
    row["measured"] = len(corral["running"])
    row["target_p50_ms"] = 5.0
    row["meets_target"] = row["running_p50_ms"] < 5.0
    return row


# --------------------------------------------------------------------------- Q100K


def fill_queued(db: Path, n: int, work: Path) -> None:
    """`n` QUEUED command jobs (/bin/true) with plain INSERTs in the store's column order: the
    metrics bench's job rows (bench/metrics.py), made runnable here."""
    now = time.time()
    command = json.dumps(["/bin/true"])
    rows = []
    for i in range(n):
        at = now - n * 0.001 + i * 0.001
        rows.append(
            {
                **_job_row(i, now, "QUEUED"),
                "id": new_id(int(at * 1000)),
                "role": "default",
                "worker": "command",
                "priority": 0,
                "tenant": "default",
                "command": command,
                "cwd": str(work),
                "max_attempts": 3,
                "created_at": at,
                "updated_at": at,
                "sort_at": at,
            }
        )
    with sqlite3.connect(db) as conn:
        insert_rows(conn, rows)
    with sqlite3.connect(db) as conn:
        conn.execute("ANALYZE")


def fill_history(db: Path, n: int, *, analyze: bool) -> None:
    """`n` ended jobs (SUCCEEDED, one attempt each, as the metrics bench writes them) with their
    run reports written through the store (the chain stays whole), the oldest first."""
    now = time.time()
    jobs = [{**_job_row(i, now - 86400, "SUCCEEDED"), "tenant": "default"} for i in range(n)]
    with sqlite3.connect(db) as conn:
        insert_rows(conn, jobs, [_attempt_row(j, 1, "SUCCEEDED") for j in jobs])

    def report(job: dict[str, Any]) -> RunReport:
        at = float(job["updated_at"])
        return RunReport(
            id=new_id(int(at * 1000)), job_id=str(job["id"]), role=str(job["role"]),
            tenant="default", workflow=None, outcome=ReportOutcome.SUCCESS, attempts=1,
            steps=0, tool_calls=0, tokens_in=0, tokens_out=0, cost_usd=0.0, started_at=None,
            ended_at=at, duration_ms=None, summary="", created_at=at,
        )  # fmt: skip

    async def reports() -> None:
        store = SqliteStore(db)
        await store.open()
        try:
            for i in range(0, n, 1000):
                await store.record_reports([(report(j), []) for j in jobs[i : i + 1000]])
        finally:
            await store.close()

    anyio.run(reports)
    if analyze:
        with sqlite3.connect(db) as conn:
            conn.execute("ANALYZE")


async def _claim_times(db: Path, rounds: int) -> list[float]:
    store = SqliteStore(db)
    await store.open()
    try:
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            jobs = await store.reserve(
                engine_id="bench", now=time.time(), limit=8, where=QueueFilter()
            )
            out.append((time.perf_counter() - t0) * 1000)
            assert len(jobs) == 8
        return out
    finally:
        await store.close()


_NO_BOUND = Admission(max_queued=10**9)  # above any queue the scenario fills


async def _submit_times(db: Path, rounds: int, work: Path) -> list[float]:
    """Milliseconds of a store submission with the queue as deep as it is, under a bound
    above it (the bound is checked on every submission: migration 0032)."""
    store = SqliteStore(db)
    await store.open()
    try:
        out = []
        for _ in range(rounds):
            job = make_job(command=("/bin/true",), cwd=str(work))
            t0 = time.perf_counter()
            await store.submit(job, now=time.time(), aging_s=60.0, admission=_NO_BOUND)
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        await store.close()


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _ended_times(db: Path) -> list[float]:
    with sqlite3.connect(db, timeout=5) as conn:
        rows = conn.execute(
            "SELECT updated_at FROM jobs WHERE state = 'SUCCEEDED' ORDER BY updated_at"
        ).fetchall()
    return [float(r[0]) for r in rows]


def _cli_times(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, env=env, check=False)
        out.append(time.perf_counter() - t0)
        if r.returncode != 0:
            raise RuntimeError(f"{argv} failed: {r.stderr.decode(errors='replace')[-500:]}")
    return out


def run_queued_one(
    work: Path,
    n: int,
    cfg: Config,
    start_engine: Callable[[Config], Any],
    descendants: Callable[[int], list[int]],
    env: dict[str, str],
) -> dict[str, Any]:
    anyio.run(_migrate, cfg.db_path)
    t0 = time.perf_counter()
    fill_queued(cfg.db_path, n, work)
    filled_s = time.perf_counter() - t0
    claim = anyio.run(_claim_times, cfg.db_path, 100)
    jobs_cli = _cli_times(
        [sys.executable, "-m", "corral", "jobs", "--json", "--data-dir", str(cfg.data_dir)],
        5,
        env,
    )
    engine = start_engine(cfg)
    rss: dict[str, float | None] = {}
    try:
        engine.wait_ready()
        deadline = time.monotonic() + 60
        while len(_ended_times(cfg.db_path)) < FIRST_JOBS and time.monotonic() < deadline:
            time.sleep(0.05)
        rss["engine_mb"] = _vm_hwm_mb(engine.proc.pid)
        core = [
            p
            for p in descendants(engine.proc.pid)
            if b" core" in Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
        ]
        rss["core_mb"] = _vm_hwm_mb(core[0]) if core else None
    finally:
        engine.stop()
        engine.kill()
    ended = _ended_times(cfg.db_path)[:FIRST_JOBS]
    submit = anyio.run(_submit_times, cfg.db_path, 200, work)  # after the engine's run
    skip = 10  # the first jobs share the engine's start
    per_job = (
        (ended[-1] - ended[skip]) * 1000 / (len(ended) - 1 - skip)
        if len(ended) > skip + 1
        else None
    )
    return {
        "queued": n,
        "fill_s": round(filled_s, 2),
        "claim_p50_ms": round(pct(claim, 50), 3),
        "claim_p99_ms": round(pct(claim, 99), 3),
        "submit_p50_ms": round(pct(submit, 50), 3),
        "engine_ms_per_job": round(per_job, 2) if per_job else None,
        "jobs_measured": len(ended),
        "engine_rss_mb": round(rss["engine_mb"], 1) if rss.get("engine_mb") else None,
        "core_rss_mb": round(rss["core_mb"], 1) if rss.get("core_mb") else None,
        "cli_jobs_json_p50_s": round(statistics.median(jobs_cli), 3),
    }


async def _migrate(db: Path) -> None:
    store = SqliteStore(db)
    await store.open()
    await store.close()


def summarize_queued(small: dict[str, Any], big: dict[str, Any]) -> dict[str, Any]:
    def ratio(key: str) -> float | None:
        a, b = small.get(key), big.get(key)
        return round(b / a, 2) if a and b else None

    return {
        "small": small,
        "big": big,
        "claim_ratio_p50": ratio("claim_p50_ms"),
        "submit_ratio_p50": ratio("submit_p50_ms"),
        "engine_ms_per_job_ratio": ratio("engine_ms_per_job"),
        "cli_ratio": ratio("cli_jobs_json_p50_s"),
        "rss_target_mb": RSS_TARGET_MB,
        "meets_rss_target": bool(big.get("engine_rss_mb")) and big["engine_rss_mb"] < RSS_TARGET_MB,
    }


# --------------------------------------------------------------------------- CLI


def run_cli(work: Path, runs: int, env: dict[str, str]) -> dict[str, Any]:
    """`corral jobs --json` on an empty store against the bare interpreter start, alternated."""
    data = work / "cli-data"
    data.mkdir(parents=True)
    py = [sys.executable, "-c", "pass"]
    cmd = [sys.executable, "-m", "corral", "jobs", "--json", "--data-dir", str(data)]
    _cli_times(cmd, 1, env)  # creates the store: measured is the steady case
    bare, corral = [], []
    for _ in range(runs):
        bare += _cli_times(py, 1, env)
        corral += _cli_times(cmd, 1, env)
    imports = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd[1:]],
        capture_output=True,
        env=env,
        check=False,
        text=True,
    ).stderr.count("import time:")
    p50 = statistics.median(corral)
    base = statistics.median(bare)
    return {
        **_cli_configured(work, runs, env),
        "runs": runs,
        "p50_s": round(p50, 3),
        "p99_s": round(pct(corral, 99), 3),
        "baseline_p50_s": round(base, 3),
        "over_baseline_s": round(p50 - base, 3),
        "ratio": round(p50 / base, 2) if base else None,
        "modules_imported": imports - 1,
        "target_s": CLI_TARGET_S,
        "meets_target": p50 < CLI_TARGET_S,
    }


CLI_CONFIG = "scheduler: {poll_interval_s: 0.2}\nroles:\n  default: {concurrency: 4}\n"


def _cli_configured(work: Path, runs: int, env: dict[str, str]) -> dict[str, Any]:
    """`corral show ID --json` with a configuration file: loaded from its cache (the steady
    case, config_cache.py) against the same command with the cache removed before each run, so
    that the file is validated anew, alternated."""
    from corral import config_cache

    root = work / "cli-config"
    data = root / "data"
    root.mkdir(parents=True)
    (root / "corral.yaml").write_text(CLI_CONFIG)
    where = ["--data-dir", str(data), "--config", str(root / "corral.yaml")]
    corral = [sys.executable, "-m", "corral"]
    made = subprocess.run(
        [*corral, "submit", "-q", *where, "--", "true"], capture_output=True, env=env, check=True
    )
    show = [*corral, "show", made.stdout.decode().strip(), "--json", *where]
    _cli_times(show, 1, env)  # writes the cache
    cached, validated = [], []
    for _ in range(runs):
        cached += _cli_times(show, 1, env)
        (data / config_cache.NAME).unlink(missing_ok=True)
        validated += _cli_times(show, 1, env)
    hit, miss = statistics.median(cached), statistics.median(validated)
    return {
        "show_cached_p50_s": round(hit, 3),
        "show_validated_p50_s": round(miss, 3),
        "show_cached_ratio": round(hit / miss, 2),
    }


def job_env() -> dict[str, str]:
    keys = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
    return {k: os.environ[k] for k in keys if k in os.environ}
