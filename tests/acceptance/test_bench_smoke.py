"""The benchmark keeps working: its crash-recovery workload (W3, quick) loses and duplicates
nothing. Figures are not asserted here (bench/ measures them); correctness is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]


def test_quick_w3_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "w3.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--quick",
            "--only",
            "W3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    w3 = json.loads(out.read_text())["workloads"]["W3"]
    assert (w3["lost"], w3["duplicated"]) == (0, 0)
    assert w3["states"] == {"SUCCEEDED": w3["jobs"]}


def test_quick_governance_benchmark_decides_as_the_scope_says(tmp_path: Path) -> None:
    out = tmp_path / "governance.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "governance.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] is True
    rt = result["round_trip"]
    assert rt["verdicts_ok"] and rt["mismatches"] == 0 and rt["errors"] == []
    assert rt["verdicts"] == rt["expected_verdicts"] == rt["recorded_verdicts"]
    assert set(rt["verdicts"]) == {"allow", "deny"}
    assert sum(rt["verdicts"].values()) == rt["calls"] == rt["pre_tool_use"]["n"]
    assert rt["post_tool_use"]["n"] == rt["verdicts"]["allow"]
    for timing in (rt["pre_tool_use"], rt["post_tool_use"], rt["baseline"]):
        assert 0 < timing["p50_ms"] <= timing["p99_ms"] <= timing["max_ms"] < 10_000
    assert rt["ratio_p50"] > 0 and isinstance(rt["meets_target"], bool)
    dec = result["decision"]
    assert dec["verdicts_ok"] and dec["mismatches"] == 0
    for part in ("answer", "decide", "store_append"):
        assert dec[part]["n"] == dec["calls"]
        assert 0 < dec[part]["p50_us"] <= dec[part]["p99_us"] <= dec[part]["max_us"]
    assert dec["decide"]["p50_us"] < dec["answer"]["p50_us"]  # the policy is part of answer()
    assert set(result["streams"]) == {"claude-code", "codex", "opencode"}
    for s in result["streams"].values():
        assert s["lines"] >= 5_000 and s["events"] > 0
        assert s["lines_per_s"] > 0 and s["events_per_s"] > 0 and s["ratio"] > 0


def test_quick_policy_benchmark_decides_as_the_rules_say(tmp_path: Path) -> None:
    out = tmp_path / "policy.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "policy.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] is True

    def timing(t: dict[str, Any], n: int) -> None:
        assert t["n"] == n
        assert 0 < t["p50_us"] <= t["p99_us"] <= t["max_us"]
        assert 0 < t["cpu_p50_us"] <= t["cpu_p99_us"]

    pre = result["prerun"]
    assert {p["verdict"] for p in pre.values()} == {"allow", "deny", "pause", "require_approval"}
    for p in pre.values():
        assert p["mismatches"] == 0 and p["verdict"] == p["expected_verdict"]
        assert p["step"] == p["expected_step"] and isinstance(p["meets_target"], bool)
        timing(p, 500)
    gate = result["gate"]
    for name, g in gate.items():
        if name == "store_append":
            continue
        assert g["mismatches"] == 0 and g["recorded_ok"] and g["recorded_checked"] > 0, name
        timing(g, g["n"])
        assert 0 < g["n"] <= 100
    timing(gate["store_append"], 100)
    cases = result["guardrails"]["cases"]
    assert {c["verdict"] for c in cases} == {"allow", "deny", "require_approval"}
    for c in cases:
        assert c["mismatches"] == 0 and [c["verdict"], c["reason"], c["rule"]] == c["expected"]
        # cold strings miss every cache; a repeated one is remembered (Guardrails memoises)
        assert c["cold_cache_hits"] == 0 and c["warm"]["p50_us"] < c["cold"]["p50_us"]
        timing(c["cold"], 200)
        timing(c["warm"], 500)
        timing(c["shell_parse"], 200)
        assert ("sqlglot_parse_one" in c) == c["command"].startswith("duckdb")
        assert c["parse_share_p50"] > 0


def test_quick_gateway_benchmark_runs_both_paths(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gateway.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    for path in ("direct", "gateway"):
        t = result["ttft"][path]
        assert t["n"] == 40 and 0 < t["p50_ms"] <= t["p90_ms"] <= t["p99_ms"]
        tp = result["throughput"][path]
        assert tp["bytes"] >= 2_000_000 and tp["events_per_s"] > 0
    assert isinstance(result["ttft"]["meets_target"], bool)
    assert result["ttft"]["gateway_cpu_ms_per_call"] > 0


def test_quick_api_benchmark_submits_every_job_it_counts(tmp_path: Path) -> None:
    out = tmp_path / "api.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "api.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["queued_in_store"] == result["submitted"]
    assert set(result["median_submissions_per_s"]) == {"direct_1", "api_1", "direct_8", "api_8"}
    for path in ("api", "direct"):
        timing = result["get_job_ms"][path]
        assert timing["n"] == 50 and 0 < timing["p50"] <= timing["p99"]
    assert isinstance(result["meets_target"], bool)


def test_the_dashboard_benchmark_renders_every_page(tmp_path: Path) -> None:
    out = tmp_path / "ui.json"
    args = ["--jobs", "2000", "--learnings", "200", "--renders", "2", "--out", str(out)]
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ui.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "Traceback" not in r.stderr, r.stderr[-2000:]  # every page answered 200
    result = json.loads(out.read_text())
    assert r.returncode == (1 if result["over"] else 0), r.stdout + r.stderr
    pages = result["pages"]
    assert {"overview", "jobs", "job detail", "approvals", "runs"} <= set(pages)
    assert {"knowledge", "knowledge, search", "learning detail"} <= set(pages)
    for timing in pages.values():
        assert 0 < timing["p50_ms"] <= timing["p99_ms"] <= timing["max_ms"] < 60_000


def test_the_census_counts_one_commit_per_submission() -> None:
    """bench/census.py runs; a submission is one write transaction (its pre-run evaluation goes
    with the job), and the engine writes its jobs' starts, ends and reports in batches: some
    transactions, and fewer than three per job (several ends share one commit, so fewer than
    one per job is possible)."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "census.py"), "--jobs", "40"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    found = dict(line.split(": ") for line in r.stdout.splitlines() if ": " in line)
    # one each, and the new store's own first write among 40: 2 each before (the job, then
    # its evaluation)
    assert 1.0 <= float(found["submission_write_transactions_per_job"]) < 1.1, r.stdout
    assert 0.1 < float(found["engine_write_transactions_per_job"]) < 3.0, r.stdout
