"""Model gateway benchmark: what going through Corral's gateway adds to a model call.

    .venv/bin/python bench/gateway.py [--quick] [--calls N] [--out bench/results/gateway.json]

The loopback stand-in of the OpenAI Responses API (tests/agentmock) runs in one child process,
the gateway (runtime/modelgate.py, with a live attempt of generous budgets) in another, and this
process is the client, speaking HTTP/1.1 over raw sockets as a CLI would. In the same run,
alternating call by call:

- time to first token: from the request's last byte sent to the first `response.output_text.delta`
  byte received, direct to the stand-in vs through the gateway (ms, p50/p90/p99; target: < 2 ms
  added at p50). Every prompt differs, so no call is coalesced;
- throughput: a call that streams `--big-mb` of output deltas, direct vs through the gateway
  (MB/s and events/s), each metered by the gateway as it passes.

The figures are for this machine and its load: compare the two columns, not across machines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.agentmock: the loopback stand-in

DEFAULT_OUT = ROOT / "bench" / "results" / "gateway.json"
TTFT_TARGET_ADDED_P50_MS = 2.0
SMALL_TEXT = "hello from the stand-in"
BIG_DELTA = 1000  # chars per output delta of the throughput call


def serve_mock(big_mb: float) -> None:
    """Child: two stand-ins (small answers, one big streamed answer), URLs on stdout."""
    from tests.agentmock import OpenAIResponsesMock

    repeat = max(1, int(big_mb * 1_000_000 / BIG_DELTA))
    small = OpenAIResponsesMock([{"text": SMALL_TEXT, "loop": True}], keep_alive=True).start()
    big = OpenAIResponsesMock(
        [{"text": "x" * BIG_DELTA, "repeat": repeat, "loop": True}], keep_alive=True
    ).start()
    print(json.dumps({"small": small.url, "big": big.url}), flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def serve_gateway(upstreams: dict[str, str], data_dir: str) -> None:
    """Child: the gateway, one worker per stand-in, a live attempt each; URL + tokens on stdout."""
    from types import SimpleNamespace

    import anyio

    from corral.domain.models import Limits
    from corral.domain.settings import GatewaySpec, Settings, WorkerSpec
    from corral.runtime.modelgate import ModelGateway

    workers = {
        name: WorkerSpec(
            name=name,
            adapter="codex",
            env={"K": "sk-bench"},
            gateway=GatewaySpec(upstream=url, key_env="K"),
        )
        for name, url in upstreams.items()
    }
    big = Limits(max_tool_calls=10**9, token_budget_in=10**15, token_budget_out=10**15)
    live = {
        name: SimpleNamespace(
            job=SimpleNamespace(id=name, worker=name, role="bench", limits=big),
            attempt=SimpleNamespace(index=1),
            permit=SimpleNamespace(id=f"permit-{name}"),
        )
        for name in upstreams
    }

    async def stop(job_id: str, limit: str, grace: float) -> None:
        raise SystemExit(f"bench: the gateway stopped {job_id} at {limit}")

    async def main() -> None:
        gw = ModelGateway(
            settings=Settings(roles={}, environments={}, workers=workers),
            data_dir=Path(data_dir),
            live=live.get,
            stop=stop,
        )
        async with anyio.create_task_group() as tg:
            endpoint = await tg.start(gw.serve)
            tokens = {n: endpoint.token(f"{n}.1", f"permit-{n}") for n in upstreams}
            print(json.dumps({"url": endpoint.url, "tokens": tokens}), flush=True)

    anyio.run(main)


# --------------------------------------------------------------------------- the client


def call(url: str, token: str, i: int, *, marker: bytes) -> tuple[float, float, int, int]:
    """One streamed call: (ms to the first output delta, ms to the end, bytes, events)."""
    parts = urlsplit(url)
    body = json.dumps(
        {
            "model": "gpt-5.5",
            "stream": True,
            "tools": [{"name": "exec_command"}],
            "input": [{"role": "user", "content": f"call {i}"}],
        }
    ).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(head + body)
        t0 = time.perf_counter()
        first = None
        window = b""
        total = 0
        events = 0
        while True:
            data = s.recv(262144)
            if not data:
                break
            total += len(data)
            events += data.count(b"\n\n")
            if first is None:
                window = (window + data)[-65536:]
                if marker in window:
                    first = time.perf_counter()
        end = time.perf_counter()
    if first is None:
        raise SystemExit(f"bench: no output delta from {url}: {window[-300:]!r}")
    return (first - t0) * 1000, (end - t0) * 1000, total, events


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stats(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(pct(values, 0.5), 3),
        "p90_ms": round(pct(values, 0.9), 3),
        "p99_ms": round(pct(values, 0.99), 3),
    }


def start(argv: list[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"bench: {argv} did not start")
    return proc, json.loads(line)


def measure(calls: int, big_calls: int, big_mb: float, tmp: Path) -> dict[str, Any]:
    me = str(Path(__file__).resolve())
    mock, urls = start([me, "--serve-mock", str(big_mb)])
    procs = [mock]
    try:
        gw, found = start([me, "--serve-gateway", json.dumps(urls), str(tmp)])
        procs.append(gw)
        direct = {n: (u, "sk-direct") for n, u in urls.items()}
        via = {n: (found["url"], t) for n, t in found["tokens"].items()}
        marker = b"response.output_text.delta"
        for i in range(5):  # warm up both paths
            call(*direct["small"], -i, marker=marker)
            call(*via["small"], -i - 100, marker=marker)
        ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
        cpu0 = cpu_s(gw.pid)
        for i in range(calls):  # alternate which goes first
            order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
            for path in order:
                url, token = (direct if path == "direct" else via)["small"]
                ttft[path].append(call(url, token, i, marker=marker)[0])
        gateway_cpu_ms = (cpu_s(gw.pid) - cpu0) * 1000 / calls
        big: dict[str, list[tuple[float, int, int]]] = {"direct": [], "gateway": []}
        for i in range(big_calls):
            for path in ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct"):
                url, token = (direct if path == "direct" else via)["big"]
                _, ms, size, events = call(url, token, 10**6 + i, marker=marker)
                big[path].append((ms, size, events))
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
    out: dict[str, Any] = {"ttft": {k: stats(v) for k, v in ttft.items()}}
    added = out["ttft"]["gateway"]["p50_ms"] - out["ttft"]["direct"]["p50_ms"]
    out["ttft"]["added_p50_ms"] = round(added, 3)
    out["ttft"]["meets_target"] = added < TTFT_TARGET_ADDED_P50_MS
    out["ttft"]["gateway_cpu_ms_per_call"] = round(gateway_cpu_ms, 3)
    tp = {}
    for path, runs in big.items():
        ms = pct([r[0] for r in runs], 0.5)
        size, events = runs[0][1], runs[0][2]
        tp[path] = {
            "n": len(runs),
            "p50_ms": round(ms, 1),
            "bytes": size,
            "mb_per_s": round(size / 1e6 / (ms / 1000), 1),
            "events_per_s": round(events / (ms / 1000)),
        }
    tp["ratio"] = round(tp["gateway"]["mb_per_s"] / tp["direct"]["mb_per_s"], 3)
    out["throughput"] = tp
    return out


def environment() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    ap.add_argument("--calls", type=int, default=300, help="time-to-first-token calls per path")
    ap.add_argument("--big-calls", type=int, default=5, help="throughput calls per path")
    ap.add_argument("--big-mb", type=float, default=20.0, help="MB streamed per throughput call")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON summary to write")
    ap.add_argument("--serve-mock", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--serve-gateway", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_mock is not None:
        serve_mock(args.serve_mock)
        return 0
    if args.serve_gateway:
        serve_gateway(json.loads(args.serve_gateway[0]), args.serve_gateway[1])
        return 0
    calls, big_calls, big_mb = args.calls, args.big_calls, args.big_mb
    if args.quick:
        calls, big_calls, big_mb = 40, 1, 2.0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="corral-bench-gw-") as tmp:
        result = {
            "environment": environment(),
            "settings": {"calls": calls, "big_calls": big_calls, "big_mb": big_mb},
            **measure(calls, big_calls, big_mb, Path(tmp)),
        }
    t, tp = result["ttft"], result["throughput"]
    print(f"time to first token ({calls} calls per path, alternating):")
    for path in ("direct", "gateway"):
        s = t[path]
        print(
            f"  {path:8} p50 {s['p50_ms']:7.3f} ms  p90 {s['p90_ms']:7.3f}  p99 {s['p99_ms']:7.3f}"
        )
    mark = "PASS" if t["meets_target"] else "MISS"
    print(
        f"  added at p50: {t['added_p50_ms']:.3f} ms (target < "
        f"{TTFT_TARGET_ADDED_P50_MS} ms) {mark}; the gateway's CPU per call: "
        f"{t['gateway_cpu_ms_per_call']:.3f} ms; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"throughput ({big_mb:g} MB of output deltas, {big_calls} call(s) per path):")
    for path in ("direct", "gateway"):
        s = tp[path]
        print(f"  {path:8} {s['mb_per_s']:8.1f} MB/s  {s['events_per_s']:9d} events/s")
    print(f"  gateway / direct: {tp['ratio']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
