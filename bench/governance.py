"""Governance benchmarks: what deciding an agent's tool calls costs.

    .venv/bin/python bench/governance.py [--quick] [--out bench/results/governance.json]

- round trip: the real `corral-hook` binary, run as a CLI runs it before a tool call (a new
  process per call, the payload on stdin), against a real `Governor` serving its socket in this
  process on a SQLite store; timed from spawn to exit by a separate driver process (ms,
  p50/p99/max; target p99 < 30 ms for PreToolUse), with a bare process start (`/bin/true`, same
  plumbing) timed in the same loop as the baseline. The verdicts are checked against what the
  scope says of each call, and against the evaluations the store recorded;
- in-engine decision: `Governor.answer(request)` called directly (no socket, no process: stream
  read, policy, store append, reply; target < 200 µs at p99), and the decision alone,
  `policy.toolcall.decide` (scope, paths resolved, guardrails; µs, p50/p99);
- stream parsing: the recorded Claude Code, Codex and OpenCode fixtures repeated to >= 100k lines
  through their live parsers (lines/s, events/s), against plain `json.loads` of the same lines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from corral.domain.agents import PolicyEvaluation
from corral.domain.ids import new_id
from corral.domain.models import Attempt, Claimed, Job, JobOptions, Limits, Permit
from corral.domain.settings import RoleSpec, Settings
from corral.domain.states import AttemptState, DedupMode, JobState
from corral.policy import scopes as policy
from corral.policy import toolcall
from corral.runtime.governor import Governor
from corral.store.sqlite import SqliteStore
from corral.workers import native
from corral.workers.agents.base import governance_socket
from corral.workers.process import STDOUT
from corral.workers.streams import (
    ClaudeStreamParser,
    CodexStreamParser,
    OpenCodeStreamParser,
    StreamParser,
)

BENCH_DIR = Path(__file__).resolve().parent
FIXTURES = BENCH_DIR.parent / "tests" / "fixtures" / "agent-cli"
DEFAULT_OUT = BENCH_DIR / "results" / "governance.json"

ROUND_TRIP_TARGET_P99_MS = 30.0
DECISION_TARGET_P99_US = 200.0
CLI = "claude-code"
SCOPE = ("Bash(kubectl *)", "Bash(ray *)", "Read(/srv/ml/**)")
LIMITS = Limits(max_tool_calls=10**9, token_budget_in=10**12, token_budget_out=10**12)
SESSION = "399c44a5-ff4b-48ad-b022-67062864551c"
BASELINE = "/bin/true"

# The calls, in the order the benchmark cycles through them, with what the scope must say.
CASES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("Bash", {"command": "kubectl get pods -n ml", "description": "List pods"}, "allow"),
    ("Bash", {"command": "ray job status raysubmit_42", "description": "Job status"}, "allow"),
    ("Read", {"file_path": "/srv/ml/train/config.yaml"}, "allow"),
    (
        "Bash",
        {
            "command": "kubectl logs -n ml train-0 --tail=50 && ray job logs raysubmit_42",
            "description": "Logs",
        },
        "allow",
    ),
    (
        "Bash",
        {"command": "kubectl get pods -n ml | grep train", "description": "Find training pods"},
        "deny",
    ),  # grep is not in scope
    ("Bash", {"command": "rm -rf /tmp/x", "description": "Clean up"}, "deny"),
    (
        "Edit",
        {
            "file_path": "/srv/ml/train/config.yaml",
            "old_string": "lr: 0.1",
            "new_string": "lr: 0.01",
        },
        "deny",
    ),
)

# Where each CLI's stream comes from (recorded CLI outputs).
STREAMS: tuple[
    tuple[str, str, type[ClaudeStreamParser | CodexStreamParser | OpenCodeStreamParser]], ...
] = (
    ("claude-code", "claude-code-2.1.330/stream-json_basic.jsonl", ClaudeStreamParser),
    ("codex", "codex-0.169.0/exec-json_commands_file_change.jsonl", CodexStreamParser),
    ("opencode", "opencode-1.18.33/run-format-json_basic.jsonl", OpenCodeStreamParser),
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float], unit: str, digits: int = 1) -> dict[str, Any]:
    return {
        "n": len(values),
        f"p50_{unit}": round(pct(values, 0.5), digits),
        f"p99_{unit}": round(pct(values, 0.99), digits),
        f"max_{unit}": round(max(values), digits),
    }


# --------------------------------------------------------------------------- payloads


def pre_payload(i: int, tool: str, tool_input: Mapping[str, Any]) -> dict[str, Any]:
    """A PreToolUse hook payload in Claude Code 2.1.330's shape (hook-stdin-payloads.jsonl)."""
    return {
        "session_id": SESSION,
        "transcript_path": f"/home/agent/.claude/projects/-srv-ml/{SESSION}.jsonl",
        "cwd": "/srv/ml",
        "prompt_id": "c31c3c9e-fbfe-4507-9d17-4e2a5a7c5aa2",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": dict(tool_input),
        "tool_use_id": f"toolu_{i:024x}",
    }


def post_payload(i: int, tool: str, tool_input: Mapping[str, Any]) -> dict[str, Any]:
    """The PostToolUse payload after an allowed call ran."""
    return {
        **pre_payload(i, tool, tool_input),
        "hook_event_name": "PostToolUse",
        "tool_response": {
            "stdout": "NAME READY STATUS\ntrain-0 1/1 Running\n",
            "stderr": "",
            "interrupted": False,
            "isImage": False,
            "noOutputExpected": False,
        },
        "duration_ms": 44,
    }


def request(claimed: Claimed, payload: Mapping[str, Any]) -> bytes:
    """What corral-hook sends: its header line, then the payload."""
    header = {
        "op": "hook",
        "attempt": f"{claimed.job.id}.{claimed.attempt.index}",
        "token": claimed.permit.id,
        "cli": CLI,
    }
    return json.dumps(header).encode() + b"\n" + json.dumps(payload).encode()


def verdict_of(code: int, text: str) -> str:
    """The verdict in Claude Code's hook language (exit 0 + JSON), or `error`."""
    if code != 0:
        return "error"
    try:
        return str(json.loads(text)["hookSpecificOutput"]["permissionDecision"])
    except (ValueError, KeyError, TypeError):
        return "error"


# --------------------------------------------------------------------------- the rig


class Rig:
    """A SQLite store, one role scoped to SCOPE, live claude-code attempts and their Governor."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = SqliteStore(root / "corral.db")
        role = RoleSpec(name="ops", worker=CLI, tools=SCOPE, limits=LIMITS)
        self.settings = Settings(roles={"ops": role}, environments={})
        self.live: dict[str, Claimed] = {}
        self.stops: list[tuple[str, str, float]] = []
        self.governor = Governor(
            store=self.store,
            settings=self.settings,
            data_dir=root,
            adapter_of=lambda kind: kind,
            live=self.live.get,
            stop=self._stop,
        )

    async def _stop(self, job_id: str, limit: str, grace: float) -> None:
        self.stops.append((job_id, limit, grace))

    async def attempt(self) -> Claimed:
        """Submit a job and claim its first attempt; its stream holds a recorded Claude run."""
        now = time.time()
        job = Job(
            id=new_id(),
            state=JobState.QUEUED,
            role="ops",
            worker=CLI,
            env_name="local",
            priority=0,
            tenant="default",
            command=(),
            prompt="Why is training slow?",
            cwd=None,
            env={},
            options=JobOptions(),
            limits=LIMITS,
            key=None,
            dedup=DedupMode.COALESCE,
            workspace=None,
            parent_id=None,
            depth=0,
            created_at=now,
            updated_at=now,
            sort_at=now,
        )
        job = (await self.store.submit(job, now=now, aging_s=60.0)).job
        attempt_dir = self.root / "attempts" / job.id / "1"
        attempt_dir.mkdir(parents=True)
        stream = FIXTURES / STREAMS[0][1]
        (attempt_dir / STDOUT).write_bytes(stream.read_bytes() if stream.exists() else b"")
        permit_id = new_id()
        attempt = Attempt(
            id=new_id(),
            job_id=job.id,
            index=1,
            state=AttemptState.STARTING,
            permit_id=permit_id,
            deadline_at=now + 3600,
            created_at=now,
            dir=str(attempt_dir),
            engine_id="bench",
        )
        permit = Permit(
            id=permit_id,
            job_id=job.id,
            attempt_index=1,
            issued_at=now,
            deadline_at=now + 3600,
            grace_s=10.0,
            granted={"role": "ops"},
            breaker="closed",
            seal="bench",
        )
        won = await self.store.start_attempts(
            [Claimed(job=job, attempt=attempt, permit=permit)], now=now
        )
        assert len(won) == 1, "could not claim the benchmark's attempt"
        self.live[job.id] = won[0]
        return won[0]

    async def recorded(self, claimed: Claimed) -> dict[str, int]:
        """Tool-call evaluations the store holds for an attempt, by verdict."""
        evaluations = await self.store.policy_evaluations(
            claimed.job.id, attempt=claimed.attempt.index, limit=10**9
        )
        return dict(Counter(e.verdict for e in evaluations if e.stage == "tool_call"))


# --------------------------------------------------------------------------- 1. round trip


def drive(spec_path: str) -> None:
    """The driver process: spawn the hook (and the baseline) once per call, timing each."""
    spec = json.loads(Path(spec_path).read_text())
    hook: list[str] = spec["hook"]
    calls: list[dict[str, Any]] = spec["calls"]

    def timed(argv: list[str], data: bytes) -> tuple[float, int, str]:
        t0 = time.perf_counter_ns()
        r = subprocess.run(argv, input=data, capture_output=True, check=False)
        return (time.perf_counter_ns() - t0) / 1e6, r.returncode, r.stdout.decode()

    for _ in range(spec["warmup"]):  # page cache, the socket's first accept: not timed
        timed([BASELINE], b"")
    out: dict[str, Any] = {"baseline": [], "pre": [], "post": [], "verdicts": [], "errors": []}
    for i, call in enumerate(calls):
        pre, post = call["pre"].encode(), call["post"].encode()
        if i % 2:  # alternate which runs first, so drift hits both alike
            out["baseline"].append(timed([BASELINE], pre)[0])
        ms, code, text = timed(hook, pre)
        out["pre"].append(ms)
        verdict = verdict_of(code, text)
        out["verdicts"].append(verdict)
        if verdict == "error":
            out["errors"].append(f"exit {code}: {text[:200]}")
        if i % 2 == 0:
            out["baseline"].append(timed([BASELINE], pre)[0])
        if verdict == "allow":  # the tool ran: the CLI reports it afterwards
            ms, code, text = timed(hook, post)
            out["post"].append(ms)
            if code != 0:
                out["errors"].append(f"post exit {code}: {text[:200]}")
    print(json.dumps(out))


async def bench_round_trip(rig: Rig, n: int, warmup: int) -> dict[str, Any]:
    claimed = await rig.attempt()
    hook = [
        str(native.hook_path()),
        str(governance_socket(rig.root)),
        f"{claimed.job.id}.{claimed.attempt.index}",
        claimed.permit.id,
        CLI,
        "10000",
    ]
    calls, expected = [], []
    for i in range(n):
        tool, tool_input, verdict = CASES[i % len(CASES)]
        calls.append(
            {
                "pre": json.dumps(pre_payload(i, tool, tool_input)),
                "post": json.dumps(post_payload(i, tool, tool_input)),
            }
        )
        expected.append(verdict)
    spec = rig.root / "drive.json"
    spec.write_text(json.dumps({"hook": hook, "calls": calls, "warmup": warmup}))
    socket = governance_socket(rig.root)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.governor.serve)
        while not socket.exists():
            await anyio.sleep(0.005)
        driver = [sys.executable, str(Path(__file__).resolve()), "--drive", str(spec)]
        done = await anyio.run_process(driver, check=False)
        tg.cancel_scope.cancel()
    if done.returncode != 0:
        raise RuntimeError(f"the driver failed: {done.stderr.decode()[-2000:]}")
    got = json.loads(done.stdout)
    verdicts = dict(Counter(got["verdicts"]))
    want = dict(Counter(expected))
    recorded = await rig.recorded(claimed)
    pre, base = summary(got["pre"], "ms", 2), summary(got["baseline"], "ms", 2)
    return {
        "calls": n,
        "cli": CLI,
        "scope": list(SCOPE),
        "hook": Path(hook[0]).name,
        "pre_tool_use": pre,
        "post_tool_use": summary(got["post"], "ms", 2),
        "baseline": {"command": BASELINE, **base},
        "ratio_p50": round(pre["p50_ms"] / base["p50_ms"], 2),
        "ratio_p99": round(pre["p99_ms"] / base["p99_ms"], 2),
        "target_p99_ms": ROUND_TRIP_TARGET_P99_MS,
        "meets_target": pre["p99_ms"] < ROUND_TRIP_TARGET_P99_MS,
        "verdicts": verdicts,
        "expected_verdicts": want,
        "recorded_verdicts": recorded,
        "mismatches": sum(1 for a, b in zip(got["verdicts"], expected, strict=True) if a != b),
        "verdicts_ok": got["verdicts"] == expected and recorded == want,
        "errors": got["errors"][:5],
    }


# --------------------------------------------------------------------------- 2. in-engine


async def bench_decision(rig: Rig, n: int) -> dict[str, Any]:
    claimed = await rig.attempt()
    requests = [
        (request(claimed, pre_payload(i, tool, tool_input)), verdict)
        for i, (tool, tool_input, verdict) in enumerate(CASES)
    ]
    for data, _ in requests:  # the first call builds the attempt's monitor: not timed
        await rig.governor.answer(data)
    answer: list[float] = []
    mismatches = 0
    for i in range(n):
        data, verdict = requests[i % len(requests)]
        t0 = time.perf_counter_ns()
        code, text = await rig.governor.answer(data)
        answer.append((time.perf_counter_ns() - t0) / 1000)
        mismatches += verdict_of(code, text) != verdict
    scope = policy.Scope.parse(SCOPE)
    used = policy.Usage(tool_calls=10, tokens_in=5_000, tokens_out=800)
    calls = [
        policy.Call(tool=tool, input=tool_input, workspace="/srv/ml")
        for tool, tool_input, _verdict in CASES
    ]
    decide: list[float] = []
    by_case: dict[int, list[float]] = {k: [] for k in range(len(CASES))}
    for i in range(n):
        k = i % len(CASES)
        tool, tool_input, verdict = CASES[k]
        t0 = time.perf_counter_ns()
        d = toolcall.decide(
            calls[k],
            role="ops",
            scope=scope,
            guardrails=rig.governor.guardrails,
            used=used,
            limits=LIMITS,
        )
        us = (time.perf_counter_ns() - t0) / 1000
        decide.append(us)
        by_case[k].append(us)
        mismatches += d.verdict != verdict
    append: list[float] = []
    for i in range(n):  # the store's share: one evaluation like the governor's, one transaction
        tool, tool_input, verdict = CASES[i % len(CASES)]
        evaluation = PolicyEvaluation(
            at=time.time(),
            job_id=claimed.job.id,
            attempt=claimed.attempt.index,
            stage="tool_call",
            subject=tool,
            verdict="allow",
            reason="allowed",
            message=f"{tool} is in scope",
            inputs={
                "input": tool_input,
                "call_id": f"toolu_{i:024x}",
                "session_id": SESSION,
                "tool_calls": i,
                "tokens_in": 5_000,
                "tokens_out": 800,
                "rule": tool,
                "limits": {
                    "max_tool_calls": 50,
                    "token_budget_in": 100_000,
                    "token_budget_out": 10_000,
                },
                "scope": list(SCOPE),
            },
        )
        t0 = time.perf_counter_ns()
        await rig.store.append_policy_evaluations([evaluation])
        append.append((time.perf_counter_ns() - t0) / 1000)
    a, p = summary(answer, "us"), summary(decide, "us")
    return {
        "calls": n,
        "answer": a,
        "decide": p,
        "store_append": summary(append, "us"),
        "decide_p50_us_by_call": {
            f"{CASES[k][0]} {CASES[k][1].get('command') or CASES[k][1].get('file_path')}": round(
                pct(v, 0.5), 1
            )
            for k, v in by_case.items()
        },
        "target_p99_us": DECISION_TARGET_P99_US,
        "meets_target": a["p99_us"] < DECISION_TARGET_P99_US,
        "decide_meets_target": p["p99_us"] < DECISION_TARGET_P99_US,
        "mismatches": mismatches,
        "verdicts_ok": mismatches == 0,
    }


# --------------------------------------------------------------------------- 3. streams


def bench_streams(min_lines: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    now = time.time()
    for cli, name, parser_type in STREAMS:
        lines = [ln for ln in (FIXTURES / name).read_bytes().split(b"\n") if ln.strip()]
        runs = -(-min_lines // len(lines))
        events = 0
        t0 = time.perf_counter()
        for _ in range(runs):  # one recorded run per parser, as one attempt is
            parser: StreamParser = parser_type()
            for line in lines:
                events += len(parser.feed(line, now))
        parse_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(runs):
            for line in lines:
                json.loads(line)
        base_s = time.perf_counter() - t0
        total = runs * len(lines)
        out[cli] = {
            "fixture": name,
            "lines": total,
            "events": events,
            "lines_per_s": round(total / parse_s),
            "events_per_s": round(events / parse_s),
            "us_per_line": round(parse_s / total * 1e6, 2),
            "baseline_lines_per_s": round(total / base_s),
            "ratio": round(base_s / parse_s, 3),
        }
    return out


# --------------------------------------------------------------------------- reporting


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", *args],
            cwd=BENCH_DIR.parent,
            capture_output=True,
            text=True,
            check=False,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def environment() -> dict[str, Any]:
    import corral

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "corral_src": str(Path(corral.__file__).resolve().parent),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "src_modified": bool(_git("status", "--porcelain", "--", "src")),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def _mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_report(rt: dict[str, Any], dec: dict[str, Any], streams: dict[str, Any]) -> None:
    pre, post, base = rt["pre_tool_use"], rt["post_tool_use"], rt["baseline"]
    head = f"{'measure':<34} {'p50':>10} {'p99':>10} {'max':>10}  {'target':<14} result"
    print(head)
    print("-" * len(head))
    print(
        f"{'hook round trip, PreToolUse':<34} {pre['p50_ms']:>7.2f} ms {pre['p99_ms']:>7.2f} ms"
        f" {pre['max_ms']:>7.2f} ms  {'p99 < 30 ms':<14} {_mark(rt['meets_target'])}"
    )
    print(
        f"{'hook round trip, PostToolUse':<34} {post['p50_ms']:>7.2f} ms "
        f"{post['p99_ms']:>7.2f} ms {post['max_ms']:>7.2f} ms  {'-':<14}"
    )
    print(
        f"{'baseline: ' + BASELINE + ' process':<34} {base['p50_ms']:>7.2f} ms "
        f"{base['p99_ms']:>7.2f} ms {base['max_ms']:>7.2f} ms  {'-':<14} "
        f"ratio {rt['ratio_p50']:.2f}x p50, {rt['ratio_p99']:.2f}x p99"
    )
    a, d = dec["answer"], dec["decide"]
    print(
        f"{'in-engine decision (policy)':<34} {d['p50_us']:>7.1f} µs "
        f"{d['p99_us']:>7.1f} µs {d['max_us']:>7.1f} µs  {'p99 < 200 µs':<14} "
        f"{_mark(dec['decide_meets_target'])}"
    )
    print(
        f"{'Governor.answer (+ durable write)':<34} {a['p50_us']:>7.1f} µs "
        f"{a['p99_us']:>7.1f} µs {a['max_us']:>7.1f} µs  {'-':<14}"
    )
    s = dec["store_append"]
    print(
        f"{'  of which store append (SQLite)':<34} {s['p50_us']:>7.1f} µs "
        f"{s['p99_us']:>7.1f} µs {s['max_us']:>7.1f} µs  {'-':<14}"
    )
    v = ", ".join(f"{k} {n}" for k, n in sorted(rt["verdicts"].items()))
    print(
        f"({rt['calls']} hook calls, {CLI} payloads, scope {', '.join(SCOPE)}: {v}; "
        f"verdicts {'as expected' if rt['verdicts_ok'] else 'WRONG'}, recorded "
        f"{rt['recorded_verdicts']}; {dec['calls']} in-engine calls"
        f"{'' if dec['verdicts_ok'] else ', WRONG verdicts'})"
    )
    print()
    head = (
        f"{'stream parser':<14} {'lines':>8} {'lines/s':>10} {'events/s':>10} {'µs/line':>8} "
        f"{'json.loads/s':>13} {'ratio':>6}"
    )
    print(head)
    print("-" * len(head))
    for cli, s in streams.items():
        print(
            f"{cli:<14} {s['lines']:>8} {s['lines_per_s']:>10} {s['events_per_s']:>10} "
            f"{s['us_per_line']:>8.2f} {s['baseline_lines_per_s']:>13} {s['ratio']:>6.2f}"
        )
    print("(ratio = parser lines/s ÷ plain json.loads lines/s over the same lines)")


# --------------------------------------------------------------------------- main


async def measure(root: Path, quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    rig = Rig(root)
    await rig.store.open()
    try:
        rt = await bench_round_trip(rig, 40 if quick else 500, 5 if quick else 20)
        dec = await bench_decision(rig, 300 if quick else 5_000)
    finally:
        await rig.store.close()
    if rig.stops:
        raise RuntimeError(f"the governor stopped an attempt: {rig.stops}")
    return rt, dec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON summary to write")
    ap.add_argument("--drive", help=argparse.SUPPRESS)  # internal: the round trip's driver
    args = ap.parse_args(argv)
    if args.drive:
        drive(args.drive)
        return 0
    env = environment()
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    native.hook_path()  # compile the hook once, outside any timing
    # A short directory: the governance socket's path must fit AF_UNIX's 108 bytes.
    with tempfile.TemporaryDirectory(prefix="corral-gov-bench-") as d:
        rt, dec = anyio.run(measure, Path(d), args.quick)
    streams = bench_streams(5_000 if args.quick else 100_000)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    ok = rt["verdicts_ok"] and dec["verdicts_ok"] and not rt["errors"]
    result = {
        "environment": env,
        "quick": args.quick,
        "ok": ok,
        "round_trip": rt,
        "decision": dec,
        "streams": streams,
    }
    print()
    print_report(rt, dec, streams)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {args.out}")
    if not ok:
        print(
            "ERROR: verdicts differ from the scope's, or the hook failed: "
            f"{rt['errors'] or rt['verdicts']}",
            file=sys.stderr,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
