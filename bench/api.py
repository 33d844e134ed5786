"""HTTP API benchmark: what submitting through `corral serve`'s HTTP API costs against the same
submissions made through the services on the store directly.

    .venv/bin/python bench/api.py [--quick] [--jobs N] [--gets N] [--repeat R]
                                  [--out bench/results/api.json]

One data directory (SQLite), one engine (`python -m corral serve --http 127.0.0.1:0`) with a
global pause so the submitted jobs stay queued (what is measured is the submission, not the
runs). In the same run, alternating which goes first, round after round:

- direct: `services.submissions.submit` on a store opened in this process — the code path
  behind both `corral submit` and the API route — with no wake-up poke (the cheapest direct
  path: the API's route wakes its engine in process);
- API: `POST /api/v1/jobs` with the same body through `corral.client.AsyncClient` (httpx,
  keep-alive), as a control plane would submit;

each with 1 client (one submission after the other) and 8 concurrent clients (8 tasks on one
store for direct; 8 AsyncClients, one connection each, for the API). Then the latency of
`GET /api/v1/jobs/{id}` (one keep-alive client, p50/p99) next to the same read direct
(`services.queries.job_detail`). Target: the API path ≥ 0.7 × the direct one in submissions/s.

The figures are for this machine and its load: compare the columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from corral.client import AsyncClient
from corral.config import Config, load
from corral.core.ports import Store
from corral.domain.governance import ScopeKind
from corral.runtime.assembly import build_store
from corral.services import controls, queries, tokens
from corral.services.submissions import SubmitRequest, submit

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "api.json"
TARGET = 0.7
CLIENTS = 8
TENANT = "bench"
CONFIG = """\
scheduler:
  max_queued: 10000000
api:
  rate_limit: {per_s: 1000000, burst: 1000000}
roles:
  default: {concurrency: 1}
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float:
    return pct(values, 0.5)


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of this process, or of process `pid` (/proc)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed(
    n: int, clients: int, one: Callable[[int], Awaitable[None]], cpu: dict[str, float]
) -> float:
    """Submissions per second: `n` calls of `one(client)` by `clients` concurrent workers;
    `cpu` gets the milliseconds of CPU per call of this process and of the engine's."""
    each = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]

    async def worker(i: int) -> None:
        for _ in range(each[i]):
            await one(i)

    engine = int(os.environ["BENCH_ENGINE_PID"])
    c0, e0, t0 = cpu_s(None), cpu_s(engine), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(worker, i)
    elapsed = time.perf_counter() - t0
    cpu["client"] = (cpu_s(None) - c0) * 1000 / n
    cpu["engine"] = (cpu_s(engine) - e0) * 1000 / n
    return n / elapsed


def start_engine(data: Path, cfg_path: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--data-dir",
            str(data),
            "--config",
            str(cfg_path),
            "--http",
            "127.0.0.1:0",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"bench: the engine did not serve HTTP:\n{log.read_text()[-2000:]}")


async def prepare(cfg: Config) -> str:
    """A token for the bench tenant, and a global pause: the jobs stay queued."""
    store = build_store(cfg)
    await store.open()
    try:
        made = await tokens.create(store, tenant=TENANT, scopes="jobs:read,jobs:write", by="bench")
        await controls.pause(
            store,
            scope=ScopeKind.GLOBAL,
            target=None,
            reason="bench/api.py: submissions only",
            by="bench",
            wake=lambda op: None,
        )
        return made.text
    finally:
        await store.close()


async def get_latency(
    store: Store, client: AsyncClient, job_id: str, gets: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of `GET /api/v1/jobs/{id}` and of the same read direct, alternating."""
    api_ms: list[float] = []
    direct_ms: list[float] = []

    async def api() -> None:
        assert (await client.get(job_id)).id == job_id

    async def direct() -> None:
        assert (await queries.job_detail(store, job_id)).job.id == job_id

    for i in range(gets):
        pair = [(api, api_ms), (direct, direct_ms)]
        for fn, out in pair if i % 2 == 0 else pair[::-1]:
            t0 = time.perf_counter()
            await fn()
            out.append((time.perf_counter() - t0) * 1000)
    return api_ms, direct_ms


async def measure(
    cfg: Config, url: str, token: str, work: Path, jobs: int, gets: int, repeat: int
) -> dict[str, Any]:
    store: Store = build_store(cfg)
    await store.open()
    clients = [AsyncClient(url, token) for _ in range(CLIENTS)]
    request = SubmitRequest(command=("true",), tenant=TENANT, cwd=str(work))
    counts = {"direct": 0, "api": 0}

    async def direct(_: int) -> None:
        await submit(store, cfg, request, lambda op: None)
        counts["direct"] += 1

    async def api(i: int) -> None:
        made = await clients[i].submit(["true"], cwd=str(work))
        assert made.created and made.job.tenant == TENANT
        counts["api"] += 1

    try:
        for i in range(20):  # warm both paths: connections, the published configuration
            await direct(0)
            await api(i % CLIENTS)
        rounds: list[dict[str, float]] = []
        cpu_rounds: list[dict[str, float]] = []
        for r in range(repeat):
            one: dict[str, float] = {}
            cpu_one: dict[str, float] = {}
            for n_clients in (1, CLIENTS):
                order = [("direct", direct), ("api", api)]
                if r % 2:
                    order.reverse()
                for name, fn in order:
                    cpu: dict[str, float] = {}
                    one[f"{name}_{n_clients}"] = await timed(jobs, n_clients, fn, cpu)
                    # direct: the submitting process alone (the engine idles, paused);
                    # API: the client's process plus the engine serving the requests
                    cpu_one[f"{name}_{n_clients}"] = (
                        cpu["client"] if name == "direct" else cpu["client"] + cpu["engine"]
                    )
                    if name == "api":
                        cpu_one[f"api_{n_clients}_engine"] = cpu["engine"]
            rounds.append(one)
            cpu_rounds.append(cpu_one)
            print(
                f"round {r + 1}: " + "  ".join(f"{k} {v:.0f}/s" for k, v in one.items()),
                flush=True,
            )

        job_id = (await clients[0].submit(["true"], cwd=str(work))).job.id
        api_ms, direct_ms = await get_latency(store, clients[0], job_id, gets)
        listed = await store.counts()
    finally:
        for c in clients:
            await c.aclose()
        await store.close()

    keys = rounds[0].keys()
    med = {k: median([r[k] for r in rounds]) for k in keys}
    cpu_med = {k: median([r[k] for r in cpu_rounds]) for k in cpu_rounds[0]}
    ratio_1 = med["api_1"] / med["direct_1"]
    ratio_8 = med[f"api_{CLIENTS}"] / med[f"direct_{CLIENTS}"]
    submitted = counts["direct"] + counts["api"] + 1
    return {
        "rounds": rounds,
        "median_submissions_per_s": {k: round(v, 1) for k, v in med.items()},
        "median_cpu_ms_per_submission": {k: round(v, 3) for k, v in cpu_med.items()},
        "rounds_cpu_ms": cpu_rounds,
        "ratio_1_client": round(ratio_1, 3),
        f"ratio_{CLIENTS}_clients": round(ratio_8, 3),
        "target": TARGET,
        "meets_target": min(ratio_1, ratio_8) >= TARGET,
        "get_job_ms": {
            "api": {
                "n": len(api_ms),
                "p50": round(pct(api_ms, 0.5), 3),
                "p99": round(pct(api_ms, 0.99), 3),
            },
            "direct": {
                "n": len(direct_ms),
                "p50": round(pct(direct_ms, 0.5), 3),
                "p99": round(pct(direct_ms, 0.99), 3),
            },
        },
        "submitted": submitted,
        "queued_in_store": listed.get("QUEUED", 0),
        "ok": listed.get("QUEUED", 0) == submitted,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (a few seconds)")
    ap.add_argument("--jobs", type=int, default=None, help="submissions per path and round")
    ap.add_argument("--gets", type=int, default=None, help="GET /api/v1/jobs/{id} calls")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (the median is reported)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    jobs = args.jobs or (40 if args.quick else 400)
    gets = args.gets or (50 if args.quick else 500)
    repeat = args.repeat or (1 if args.quick else 3)

    with tempfile.TemporaryDirectory(prefix="corral-bench-api-") as tmp:
        root = Path(tmp)
        data, work = root / "data", root / "work"
        work.mkdir()
        cfg_path = root / "corral.yaml"
        cfg_path.write_text(CONFIG)
        cfg = load(data_dir=data, config_path=cfg_path)
        token = anyio.run(prepare, cfg)
        engine, url = start_engine(data, cfg_path, root / "engine.log")
        os.environ["BENCH_ENGINE_PID"] = str(engine.pid)
        try:
            result = anyio.run(measure, cfg, url, token, work, jobs, gets, repeat)
        finally:
            os.killpg(engine.pid, signal.SIGTERM)
            try:
                engine.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(engine.pid, signal.SIGKILL)
                engine.wait()

    result["environment"] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "jobs_per_round": jobs,
        "rounds": repeat,
        "gets": gets,
    }
    med = result["median_submissions_per_s"]
    g = result["get_job_ms"]
    print(f"\nsubmissions/s (median of {repeat}; load {os.getloadavg()[0]:.2f})")
    print(
        f"  1 client : direct {med['direct_1']:8.0f}   API {med['api_1']:8.0f}   "
        f"ratio {result['ratio_1_client']:.2f}"
    )
    print(
        f"  {CLIENTS} clients: direct {med[f'direct_{CLIENTS}']:8.0f}   "
        f"API {med[f'api_{CLIENTS}']:8.0f}   ratio {result[f'ratio_{CLIENTS}_clients']:.2f}"
    )
    print(
        f"GET /api/v1/jobs/{{id}}: p50 {g['api']['p50']:.2f} ms, p99 {g['api']['p99']:.2f} ms "
        f"(direct read: p50 {g['direct']['p50']:.2f} ms, p99 {g['direct']['p99']:.2f} ms)"
    )
    c = result["median_cpu_ms_per_submission"]
    for n in (1, CLIENTS):
        print(
            f"CPU ms per submission, {n} client{'s' if n > 1 else ''}: direct "
            f"{c[f'direct_{n}']:.2f}   API {c[f'api_{n}']:.2f} (engine "
            f"{c[f'api_{n}_engine']:.2f})   direct/API {c[f'direct_{n}'] / c[f'api_{n}']:.2f}"
        )
    print(f"target API ≥ {TARGET} × direct: {'met' if result['meets_target'] else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not result["ok"]:
        print(f"bench: {result['submitted']} submitted, {result['queued_in_store']} queued")
        sys.exit(1)


if __name__ == "__main__":
    main()
