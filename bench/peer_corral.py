"""Corral as a system of the peer benchmark (the harness directory given by --peers DIR).

    .venv/bin/python bench/peer_corral.py --peers DIR [--workload w1,w2] [--repeat 3]
                                          [--out FILE.jsonl]

The peer harness's systems are scripts on top of its `peers/common.py`; this is Corral's, kept
in the repository (it needs Corral's environment, not the harness's). Per round and workload it
runs, in this one process and session, the harness's own baseline (`asyncio_bench.run_plain`:
one asyncio loop, a semaphore of K, create_subprocess_exec, no store — the "asyncio nostore"
row every peer ratio is taken against) and Corral (a live `corral serve` on a fresh SQLite data
directory; jobs submitted through the CLI's code path, bench/run.py's method), and writes one
JSON line per run in the harness's format (`common.summarize`: `peers/table.py FILE` prints it
beside the peers' results). The figures of the peers (Ray core, Celery + Redis, DBOS) measured by
the harness are read from its README: their ratio to the same baseline on a quiet pass.
Nothing is written under the harness's directory.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import run as corral_bench  # bench/run.py (this script's directory is on sys.path)

# W1 ratios to the harness's asyncio-nostore baseline, from its README (2026-11-22, quiet pass)
PEER_W1_RATIOS = {"Ray 2.60 core": 0.50, "Celery 5.7 + Redis": 0.27, "DBOS 3.4 (10 ms poll)": 0.05}


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def corral_run(common: ModuleType, workload: str, n: int, k: int, cmd: list[str], root: Path):
    """One live-engine run; t_enq = the submission, t_start = RUNNING recorded (the attempt's
    started_at, or its end for a job that ended within one flush), t_done = the job durable."""
    wl = corral_bench.Workload(workload, n, k, " ".join(cmd), lambda _w: tuple(cmd))
    work = root / f"corral-{workload}-{time.time_ns()}"  # run_corral creates it
    stats = corral_bench.run_corral(wl, work, corral_bench.Options())
    db = work / "data" / "corral.db"
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT j.id, j.created_at, COALESCE(a.started_at, a.ended_at), j.updated_at,"
            " COALESCE(j.exit_code, 0), j.state FROM jobs j"
            " JOIN attempts a ON a.job_id = j.id AND a.idx = j.attempts"
        ).fetchall()
    t_enq = {r[0]: r[1] for r in rows}
    t_start = {r[0]: r[2] for r in rows if r[2] is not None}
    t_done = {r[0]: r[3] for r in rows if r[5] == "SUCCEEDED"}
    rcs = {r[0]: r[4] for r in rows}
    cpu = stats.extra.get("cpu_s") or {}
    return common.summarize(
        "corral",
        "live-sqlite",
        workload,
        n,
        k,
        t_enq,
        t_start,
        t_done,
        rcs,
        extra={"cpu_s": cpu, "engine_rc": stats.extra.get("engine_rc")},
    )


def baseline_run(common: ModuleType, plain: ModuleType, workload: str, n: int, k: int, cmd):
    t_enq, t_start, t_done, rcs, end = asyncio.run(plain.run_plain(n, k, cmd))
    return common.summarize(
        "asyncio", "nostore", workload, n, k, t_enq, t_start, t_done, rcs, observed_end=end
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=Path, required=True, help="the peer harness directory")
    ap.add_argument("--workload", default="w1,w2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--n", type=int, help="jobs per run (default: the harness's)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "corral-peer.jsonl")
    a = ap.parse_args(argv)
    peers = a.peers / "peers"
    if not (peers / "common.py").is_file():
        raise SystemExit(f"no peer harness at {a.peers} (--peers DIR)")
    sys.path.insert(0, str(peers))
    common = _load(peers / "common.py", "common")
    plain = _load(peers / "asyncio_bench.py", "asyncio_bench")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("")
    root = Path(tempfile.mkdtemp(prefix="corral-peer-"))
    summary: dict[str, Any] = {}
    for workload in [w.strip().lower() for w in a.workload.split(",") if w.strip()]:
        dn, k, cmd = common.WORKLOADS[workload]
        n = a.n or dn
        ratios, rates = [], {"asyncio": [], "corral": []}
        for r in range(a.repeat):  # alternate which goes first: drift hits both alike
            order = ("asyncio", "corral") if r % 2 == 0 else ("corral", "asyncio")
            got = {}
            for system in order:
                res = (
                    baseline_run(common, plain, workload, n, k, cmd)
                    if system == "asyncio"
                    else corral_run(common, workload, n, k, cmd, root)
                )
                common.emit(res, str(a.out))
                got[system] = res["jobs_per_s"] or 0.0
                rates[system].append(got[system])
            ratio = got["corral"] / got["asyncio"] if got["asyncio"] else 0.0
            ratios.append(ratio)
            print(
                f"{workload} round {r + 1}: corral {got['corral']} jobs/s, asyncio nostore "
                f"{got['asyncio']} jobs/s, ratio {ratio:.3f}",
                file=sys.stderr,
            )
        summary[workload] = {
            "corral_jobs_per_s": statistics.median(rates["corral"]),
            "asyncio_nostore_jobs_per_s": statistics.median(rates["asyncio"]),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratios": [round(x, 3) for x in ratios],
        }
    print(json.dumps(summary, indent=2))
    if "w1" in summary:
        print("\nW1 ratio to the asyncio-nostore loop:")
        print(f"  Corral (this run, median of {a.repeat}): {summary['w1']['ratio_median']:.2f}")
        for name, ratio in PEER_W1_RATIOS.items():
            print(f"  {name} (the harness's README, quiet pass): {ratio:.2f}")
    print(f"\nJSON lines: {a.out} (print with {peers / 'table.py'} {a.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
