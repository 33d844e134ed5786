"""Corral + Ray against a bare JobSubmissionClient loop: the same short jobs on the same head, in
the same run.

    .venv/bin/python bench/ray.py [--jobs 50] [--cap 4] [--repeats 2] [--out FILE]

One command, quiet: stdout carries only the JSON summary, progress goes to stderr, and Ray's
and the engine's own output go to files in the run's temporary directory. It starts a Ray head
on loopback (its own process group, private ports, a temporary directory; stopped by killing
that group), then runs `--repeats` rounds on it, alternating which side goes first:

- bare: a pool of `cap` threads, each submitting `true` with `JobSubmissionClient.submit_job` and
  polling `get_job_status` every 0.5 s until it is terminal (the same cap and the same poll period
  as Corral's watcher, so both keep at most `cap` jobs in Ray);
- corral: a data directory with a `kind: ray` environment (`max_inflight: cap`), the jobs
  submitted through the submission service, `corral serve --drain` running them.

Per job it takes the time from the moment the job was handed to Ray's client (bare: the submit
call; Corral: its attempt's start) to the moment its end was seen (bare: the poll; Corral: the
attempt's end), and reports the medians, the added milliseconds per job at the median (target
< 50 ms) and the throughput ratio (jobs per second, Corral ÷ bare): over the span the jobs ran
(bare: first submit → last end seen; Corral: first attempt start → last attempt end), and over
the whole wall, which for Corral includes starting and draining the engine.

It also splits each job's time by Ray's own record of it (its `start_time`, when the job server
accepted it, and `end_time`): `outside_ray` is handed over → accepted plus ended → end seen, what
each side itself adds around a job (`added_ms_outside_ray_median`: Corral's minus bare's at the
median); `ray_run` is Ray's start → end, the job's run inside Ray (Corral's entrypoint
included). On a loaded host Ray's run of a `true` job swings by seconds between rounds; the
part outside Ray does not, so it is the figure that resolves a cost of tens of milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# This file is named ray.py: its own directory must not shadow the `ray` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT / "src"))

RAY = str(Path(sys.executable).with_name("ray"))
CORRAL = str(Path(sys.executable).with_name("corral"))
POLL_S = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_head(root: str) -> tuple[subprocess.Popen[bytes], str]:
    port, dash = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(os.path.join(root, "head.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *(RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port)),
            *("--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash)),
            *("--include-dashboard", "true", "--num-cpus", "8", "--temp-dir", root),
            # private ports for the agent and the client server too: the defaults (52365,
            # 10001) are shared by every head on the host, and a second head's agent fails
            *("--dashboard-agent-listen-port", str(free_port())),
            *("--ray-client-server-port", str(free_port())),
            *("--disable-usage-stats", "--block"),
        ],
        env=env,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    try:
        return proc, ready(proc, address)
    except BaseException:
        stop_head(proc)
        raise


def ready(proc: subprocess.Popen[bytes], address: str) -> str:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + 120
    while True:  # up when a warm-up job runs (the job agent starts after the job server)
        try:
            client = JobSubmissionClient(address)
            sid = client.submit_job(entrypoint="true")
            while client.get_job_status(sid).value not in ("SUCCEEDED", "FAILED", "STOPPED"):
                time.sleep(0.2)
            return address
        except Exception as err:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the Ray head did not start: {err}") from None
            time.sleep(0.5)


def stop_head(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def bare(address: str, jobs: int, cap: int, tag: str) -> dict[str, Any]:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}

    def one(i: int) -> tuple[float, bool, tuple[str, float, float]]:
        started, at = time.monotonic(), time.time()
        sid = client.submit_job(entrypoint="true", submission_id=f"bare-{tag}-{i}")
        while (status := client.get_job_status(sid)) not in terminal:
            time.sleep(POLL_S)
        ok = status == JobStatus.SUCCEEDED
        return time.monotonic() - started, ok, (sid, at, time.time())

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=cap) as pool:
        done = list(pool.map(one, range(jobs)))
    wall = time.monotonic() - t0
    return {
        "wall_s": wall,
        "span_s": wall,
        "per_job_s": [d for d, _, _ in done],
        "succeeded": sum(ok for _, ok, _ in done),
        **stages(client, [seen for _, _, seen in done]),
    }


def stages(client: Any, seen: list[tuple[str, float, float]]) -> dict[str, list[float]]:
    """Where each job's time went, by Ray's own record of it (`start_time`: the job accepted;
    `end_time`: it ended): `outside_ray_s` is handed over → accepted plus ended → end seen (what
    the side itself costs), `ray_run_s` Ray's start → end (the job's run in Ray, its entrypoint
    included). The first does not move with how long Ray takes to run a job on a loaded host."""
    infos = {j.submission_id: j for j in client.list_jobs()}
    outside, run = [], []
    for sid, handed, ended in seen:
        info = infos.get(sid)
        if info is None or not info.start_time or not info.end_time:
            continue
        start, end = info.start_time / 1000, info.end_time / 1000
        outside.append((start - handed) + (ended - end))
        run.append(end - start)
    return {"outside_ray_s": outside, "ray_run_s": run}


def corral(address: str, jobs: int, cap: int, root: Path) -> dict[str, Any]:
    from corral.config import load
    from corral.domain.states import JobState
    from corral.runtime.assembly import build_store
    from corral.services.submissions import SubmitRequest, submit
    from corral.workers.rayjob import submission_id

    data, work = root / "data", root / "work"
    data.mkdir(parents=True)
    work.mkdir()
    config = root / "corral.yaml"
    config.write_text(
        # a loaded machine must not crash-loop the core (its heartbeat answer can take seconds)
        "scheduler:\n  poll_interval_s: 0.2\ncore:\n  heartbeat_timeout_s: 30\n"
        "roles:\n  default:\n"
        f"    concurrency: {cap * 2}\nenvironments:\n  local:\n    max_inflight: 4\n"
        f"  ray:\n    kind: ray\n    address: {address}\n    max_inflight: {cap}\n"
    )
    cfg = load(data_dir=data, config_path=config)

    async def enqueue() -> None:
        store = build_store(cfg)
        await store.open()
        try:
            for _ in range(jobs):
                req = SubmitRequest(command=("true",), env_name="ray", cwd=str(work))
                await submit(store, cfg, req, lambda _op: False)
        finally:
            await store.close()

    asyncio.run(enqueue())
    env = {**os.environ, "CORRAL_DATA_DIR": str(data), "CORRAL_CONFIG": str(config)}
    t0 = time.monotonic()
    subprocess.run(
        [CORRAL, "serve", "--no-http", "--drain"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.monotonic() - t0

    async def collect() -> tuple[list[float], float, int]:
        store = build_store(cfg)
        await store.open()
        try:
            from corral.core.ports import JobQuery

            found = await store.list_jobs(JobQuery(limit=jobs + 10))
            per, starts, ends, ok = [], [], [], 0
            seen: list[tuple[str, float, float]] = []
            for job in found:
                ok += job.state is JobState.SUCCEEDED
                for a in await store.attempts(job.id):
                    if a.started_at and a.ended_at:
                        per.append(a.ended_at - a.started_at)
                        starts.append(a.started_at)
                        ends.append(a.ended_at)
                        seen.append((submission_id(job.id, a.index), a.started_at, a.ended_at))
            return per, (max(ends) - min(starts)) if per else 0.0, ok, seen
        finally:
            await store.close()

    per, span, ok, seen = asyncio.run(collect())
    from ray.job_submission import JobSubmissionClient

    return {
        "wall_s": wall,
        "span_s": span,
        "per_job_s": per,
        "succeeded": ok,
        **stages(JobSubmissionClient(address), seen),
    }


def _summary(b: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    med_b, med_c = statistics.median(b["per_job_s"]), statistics.median(c["per_job_s"])
    out_b, out_c = (statistics.median(x["outside_ray_s"] or [0.0]) for x in (b, c))
    run_b, run_c = (statistics.median(x["ray_run_s"] or [0.0]) for x in (b, c))
    return {
        "bare_wall_s": round(b["wall_s"], 2),
        "corral_wall_s": round(c["wall_s"], 2),
        "corral_span_s": round(c["span_s"], 2),
        "throughput_ratio": round(b["span_s"] / c["span_s"], 3),
        "throughput_ratio_wall": round(b["wall_s"] / c["wall_s"], 3),
        "bare_median_ms": round(med_b * 1000, 1),
        "corral_median_ms": round(med_c * 1000, 1),
        "added_ms_per_job_median": round((med_c - med_b) * 1000, 1),
        "bare_outside_ray_ms": round(out_b * 1000, 1),
        "corral_outside_ray_ms": round(out_c * 1000, 1),
        "added_ms_outside_ray_median": round((out_c - out_b) * 1000, 1),
        "bare_ray_run_ms": round(run_b * 1000, 1),
        "corral_ray_run_ms": round(run_c * 1000, 1),
        "bare_succeeded": b["succeeded"],
        "corral_succeeded": c["succeeded"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ray.json"))
    args = parser.parse_args()
    logging.getLogger("ray").setLevel(logging.WARNING)  # Ray's client logs nothing to stdout
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the head
    root = tempfile.mkdtemp(prefix="cr-bench-ray-", dir="/tmp")
    proc, address = start_head(root)
    rounds: list[dict[str, Any]] = []
    print(f"ray head up at {address}", file=sys.stderr, flush=True)
    try:
        for r in range(args.repeats):
            got: dict[str, Any] = {}
            for side in ("bare", "corral") if r % 2 == 0 else ("corral", "bare"):
                if side == "bare":
                    got[side] = bare(address, args.jobs, args.cap, f"r{r}")
                else:
                    got[side] = corral(address, args.jobs, args.cap, Path(root) / f"corral{r}")
                print(
                    f"round {r + 1}: {side} {got[side]['wall_s']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            rounds.append(got)
    finally:
        stop_head(proc)
        shutil.rmtree(root, ignore_errors=True)
    per_round = [_summary(g["bare"], g["corral"]) for g in rounds]
    pooled = {
        side: {
            "wall_s": sum(g[side]["wall_s"] for g in rounds),
            "span_s": sum(g[side]["span_s"] for g in rounds),
            "per_job_s": [x for g in rounds for x in g[side]["per_job_s"]],
            "outside_ray_s": [x for g in rounds for x in g[side]["outside_ray_s"]],
            "ray_run_s": [x for g in rounds for x in g[side]["ray_run_s"]],
            "succeeded": sum(g[side]["succeeded"] for g in rounds),
        }
        for side in ("bare", "corral")
    }
    summary = {
        "jobs": args.jobs,
        "cap": args.cap,
        "repeats": args.repeats,
        **_summary(pooled["bare"], pooled["corral"]),
        "rounds": per_round,
    }
    print(json.dumps(summary, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=1))
    want = args.jobs * args.repeats
    return 0 if pooled["bare"]["succeeded"] == pooled["corral"]["succeeded"] == want else 1


if __name__ == "__main__":
    sys.exit(main())
