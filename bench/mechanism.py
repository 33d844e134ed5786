"""Core mechanism benchmarks: permit decision latency and cancel latency.

    .venv/bin/python bench/mechanism.py [--quick] [--out bench/results/mechanism.json]

- permit decision: `Core.request_permit` + release on the engine's own core (µs, p50/p99),
  against a baseline of a bare dict-and-counter admission check in the same process;
- cancel latency: from the stop request to the whole process tree gone (the shim's pid and
  every descendant), for a cooperative job (target p99 < 100 ms) and for one that ignores
  SIGTERM (target p99 < grace + 100 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from corral.config import load
from corral.domain.ids import new_id
from corral.domain.models import Job, JobOptions, Limits, Permit
from corral.domain.states import DedupMode, JobState
from corral.runtime.corebuild import build_core
from corral.workers import process


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def job(i: int) -> Job:
    return Job(
        id=new_id(),
        state=JobState.QUEUED,
        role="default",
        worker="command",
        env_name="local",
        priority=i % 5,
        tenant="default",
        command=("true",),
        prompt=None,
        cwd=None,
        env={},
        options=JobOptions(),
        limits=Limits(),
        key=None,
        dedup=DedupMode.COALESCE,
        workspace=None,
        parent_id=None,
        depth=0,
        created_at=time.time(),
        updated_at=time.time(),
        sort_at=0.0,
    )


def bench_permits(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        cfg = load(data_dir=Path(d))
        core = build_core(cfg)
        jobs = [job(i) for i in range(n)]
        samples = []
        for j in jobs:
            t0 = time.perf_counter_ns()
            permit = core.request_permit(j, 1, time.time())
            if isinstance(permit, Permit):
                core.release(permit)
            samples.append((time.perf_counter_ns() - t0) / 1000)
    base = []
    held: dict[str, int] = {}
    for j in jobs:  # the least an admission check can do: one counter per scope
        t0 = time.perf_counter_ns()
        if held.get(j.role, 0) < 4:
            held[j.role] = held.get(j.role, 0) + 1
            held[j.role] -= 1
        base.append((time.perf_counter_ns() - t0) / 1000)
    return {
        "decisions": n,
        "p50_us": round(pct(samples, 0.5), 1),
        "p99_us": round(pct(samples, 0.99), 1),
        "baseline_p50_us": round(pct(base, 0.5), 2),
    }


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return False
        except (FileNotFoundError, IndexError):
            continue
    return True


async def _cancel_once(root: Path, argv: list[str], grace_s: float) -> float:
    proc = process.spawn(
        attempt_dir=root / new_id(),
        argv=argv,
        cwd=None,
        env={"PATH": os.environ["PATH"]},
        grace_s=grace_s,
        deadline_epoch_s=None,
    )
    child_pid_file = proc.attempt_dir / "child.pid"
    while not child_pid_file.exists():  # started: the tree exists
        await anyio.sleep(0.001)
    await anyio.sleep(0.05)  # let the job's own children start
    tree = [proc.pid, *process.descendants(proc.pid)]
    t0 = time.perf_counter()
    proc.terminate()
    await proc.wait()
    while not _gone(tree):
        await anyio.sleep(0.0005)
    proc.close()
    return (time.perf_counter() - t0) * 1000


async def bench_cancel(n: int, grace_s: float) -> dict[str, Any]:
    coop = ["sh", "-c", "sleep 30 & sleep 30 & wait"]
    stubborn = ["sh", "-c", "trap '' TERM; setsid sh -c \"trap '' TERM; sleep 30\" & sleep 30"]
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        a = [await _cancel_once(root, coop, grace_s) for _ in range(n)]
        b = [await _cancel_once(root, stubborn, grace_s) for _ in range(max(3, n // 4))]
    return {
        "cooperative": {
            "runs": len(a),
            "p50_ms": round(pct(a, 0.5), 1),
            "p99_ms": round(pct(a, 0.99), 1),
            "target_p99_ms": 100,
        },
        "ignores_sigterm": {
            "runs": len(b),
            "grace_ms": grace_s * 1000,
            "p50_ms": round(pct(b, 0.5), 1),
            "p99_ms": round(pct(b, 0.99), 1),
            "target_p99_ms": grace_s * 1000 + 100,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/mechanism.json"))
    args = ap.parse_args()
    permits = bench_permits(2_000 if args.quick else 50_000)
    cancel = anyio.run(bench_cancel, 8 if args.quick else 40, 0.5)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "permit_decision": permits,
        "cancel_latency": cancel,
    }
    print(
        f"permit decision: p50 {permits['p50_us']} µs, p99 {permits['p99_us']} µs "
        f"({permits['decisions']} decisions; bare counter p50 {permits['baseline_p50_us']} µs)"
    )
    for name, r in cancel.items():
        ok = "ok" if r["p99_ms"] < r["target_p99_ms"] else "MISSED"
        print(
            f"cancel → tree gone, {name}: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms "
            f"(target < {r['target_p99_ms']:.0f} ms: {ok}; {r['runs']} runs)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
