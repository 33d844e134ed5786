"""`corral metrics` (trace/metrics.py): the exposition parses, passes `promtool check metrics`,
carries the store's and the core's figures with bounded labels, and the shipped Grafana dashboard
(deploy/grafana/corral.json) asks only for metrics it has."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.domain.agents import AgentEvent, PolicyEvaluation
from corral.domain.knowledge import Arm, KnowledgeRun
from corral.domain.states import JobState
from corral.store.memory import MemoryStore
from corral.trace import metrics
from tests.contract.test_knowledge_contract import created
from tests.contract.test_knowledge_contract import make as make_learning
from tests.contract.test_store_contract import NOW, end, start, submit

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "corral.json"
SNAPSHOT: Mapping[str, Any] = {
    "breakers": [
        {"name": "worker:claude", "scope": "worker", "state": "OPEN"},
        {"name": "provider:api.example", "scope": "provider", "state": "CLOSED"},
    ],
    "watchdog": {
        "stage": 2,
        "gauges": {
            "worker_inflight_count": 3,
            "worker_queue_lag_ms": 1500,
            "worker_timeout_rate": 0.25,
            "stalled_attempts": 1,
        },
        "by_worker": {"claude": {"worker_inflight_count": 2, "worker_queue_lag_ms": 1500}},
    },
}


async def _filled() -> tuple[MemoryStore, list[str]]:
    store = MemoryStore()
    running = await submit(store, role="coder", worker="claude", at=NOW - 10)
    await start(store, running)
    done = await submit(store, role="review", tenant="acme", worker="claude", at=NOW - 4)
    await end(store, done, JobState.SUCCEEDED)
    queued = await submit(store, role="coder", priority=2)
    await store.append_policy_evaluations(
        [
            PolicyEvaluation(
                at=NOW,
                job_id=done.id,
                attempt=1,
                stage="tool_call",
                subject="Bash",
                verdict="deny",
                reason="out_of_scope",
            )
        ]
    )
    await store.record_agent_event(
        AgentEvent(
            event_id="e1",
            job_id=done.id,
            attempt=1,
            at=NOW,
            role="review",
            worker="claude",
            tenant="acme",
            tokens_in=100,
            tokens_out=20,
            cost_usd=0.5,
        )
    )
    # an event sink that published the first two timeline records and skipped one
    assert await store.claim_cursors("bus", ["job_events"], holder="e1", now=NOW, lease_s=60)
    assert await store.advance_cursor(
        "bus", "job_events", holder="e1", last_id=2, skipped=1, now=NOW
    )
    # the knowledge flywheel: one learning, one run given it that succeeded with 3 tool calls
    learned = make_learning("l1", "Pin the seed", "Use a fixed seed in the tests", role="review")
    await store.add_learning(learned, created(learned))
    run = KnowledgeRun(
        job_id=done.id,
        attempt=1,
        tenant="acme",
        role="review",
        arm=Arm.WITH,
        reason="injected",
        injected=1,
        started_at=NOW,
    )
    await store.record_injection(run, [])
    await store.settle_run(done.id, succeeded=True, tool_calls=3, reward=None, updates=[])
    # and two runs of the control arm, one of which failed
    for job_id, ok in (("ctl-1", True), ("ctl-2", False)):
        control = replace(run, job_id=job_id, arm=Arm.WITHOUT, reason="control", injected=0)
        await store.record_injection(control, [])
        await store.settle_run(job_id, succeeded=ok, tool_calls=5, reward=None, updates=[])
    return store, [running.id, done.id, queued.id]


def _text(snapshot: Mapping[str, Any] | None = SNAPSHOT) -> tuple[str, list[str]]:
    async def main() -> tuple[str, list[str]]:
        store, ids = await _filled()
        body = await metrics.exposition(store, (lambda: snapshot) if snapshot else None)
        return body.decode(), ids

    return asyncio.run(main())


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_exposition_carries_the_knowledge_flywheel() -> None:
    s = _samples(_text()[0])
    assert s[("corral_knowledge_learnings", (("role", "review"), ("status", "active")))] == 1
    arm = (("arm", "with"), ("role", "review"))
    assert s[("corral_knowledge_runs_total", arm)] == 1
    assert s[("corral_knowledge_runs_succeeded_total", arm)] == 1
    assert s[("corral_knowledge_tool_calls_total", arm)] == 3
    control = (("arm", "without"), ("role", "review"))
    assert s[("corral_knowledge_runs_total", control)] == 2
    assert s[("corral_knowledge_success_ratio", arm)] == 1.0
    assert s[("corral_knowledge_success_ratio", control)] == 0.5
    assert s[("corral_knowledge_success_uplift", (("role", "review"),))] == 0.5


def test_exposition_carries_the_store_and_core_figures() -> None:
    text, ids = _text()
    s = _samples(text)
    assert (
        s[
            (
                "corral_queue_depth",
                (
                    ("environment", "local"),
                    ("priority", "2"),
                    ("role", "coder"),
                    ("state", "queued"),
                ),
            )
        ]
        == 1
    )
    assert s[("corral_jobs_finished_total", (("outcome", "succeeded"), ("role", "review")))] == 1
    assert (
        s[
            (
                "corral_inflight_attempts",
                (("environment", "local"), ("role", "coder"), ("worker", "claude")),
            )
        ]
        == 1
    )
    assert s[("corral_tool_calls_total", (("decision", "deny"), ("reason", "out_of_scope")))] == 1
    usage = (("provider", "anthropic"), ("role", "review"), ("tenant", "acme"))
    assert s[("corral_tokens_total", (("direction", "in"), *usage))] == 100
    assert s[("corral_tokens_total", (("direction", "out"), *usage))] == 20
    assert s[("corral_cost_usd_total", usage)] == 0.5
    assert s[("corral_attempt_duration_seconds_count", (("role", "review"),))] == 1
    assert s[("corral_submit_to_running_seconds_count", (("role", "coder"),))] == 1
    assert (
        s[
            (
                "corral_breaker_state",
                (("breaker", "worker:claude"), ("scope", "worker"), ("state", "open")),
            )
        ]
        == 1
    )
    assert (
        s[
            (
                "corral_breaker_state",
                (("breaker", "worker:claude"), ("scope", "worker"), ("state", "closed")),
            )
        ]
        == 0
    )
    assert s[("corral_watchdog_stage", ())] == 2
    assert s[("corral_worker_queue_lag_seconds", (("worker", "claude"),))] == 1.5
    assert s[("corral_worker_inflight", (("worker", "all"),))] == 3
    assert s[("corral_engine_up", ())] == 1
    assert not any(i in text for i in ids)  # never a job id in a label


def test_each_sinks_backlog_and_skipped_records() -> None:
    async def main() -> tuple[int, dict[str, tuple[float, float]]]:
        store, _ = await _filled()
        tip = sum([await store.outbox_tip(s) for s in ("job_events", "policy_evaluations")])
        body = (await metrics.exposition(store, None, sinks=["bus", "new"])).decode()
        s = _samples(body)
        return tip, {
            sink: (
                s[("corral_events_backlog", (("sink", sink),))],
                s[("corral_events_skipped_total", (("sink", sink),))],
            )
            for sink in ("bus", "new")
        }

    tip, figures = asyncio.run(main())
    assert tip > 2
    assert figures == {"bus": (tip - 2, 1), "new": (tip, 0)}  # "new" has published nothing


def test_without_an_engine_the_store_figures_still_answer() -> None:
    s = _samples(_text(None)[0])
    assert s[("corral_engine_up", ())] == 0
    assert s[("corral_jobs_finished_total", (("outcome", "succeeded"), ("role", "review")))] == 1
    assert not any(name == "corral_watchdog_stage" for name, _ in s)


def test_promtool_check_metrics_passes() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: scripts/setup installs it (Debian package prometheus)")
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=_text()[0],
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_grafana_dashboard_references_only_exposed_metrics() -> None:
    exposed = {f.name for f in text_string_to_metric_families(_text()[0])}
    exposed |= {s.name for f in text_string_to_metric_families(_text()[0]) for s in f.samples}
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bcorral_[a-z_]+", e)}
    assert used and used <= exposed, sorted(used - exposed)
    assert len(used) >= 20
