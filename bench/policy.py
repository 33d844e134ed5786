"""Policy benchmarks: what the pre-run decision and the guardrail check cost.

    .venv/bin/python bench/policy.py [--quick] [--out bench/results/policy.json]

- pre-run decision: the pure `corral.policy.prerun.decide(PrerunInput(...), now)` on realistic
  inputs, one scenario per step of the seven-step order plus all of them at once (µs,
  p50/p99; 20,000 decisions per scenario, `--quick` 500); beside it the engine's whole gate,
  `PrerunGate(store, settings, default_guardrails()).admit([job], now)` on a real SQLite store
  holding a kill switch, a pause and runs in flight of a tenant with a parallel limit, which
  includes the spawn guardrail check and appending the policy evaluation durably (distinct
  jobs, so every call writes one; an allow as the dispatcher writes it when no attempt starts
  with it, `gate.record`), with `store.append_policy_evaluations` of the same row alone as its
  baseline;
- guardrail check: `default_guardrails().evaluate(role, "tool_call", "Bash", {"command": …})` on
  realistic commands of each example role, "cold" (a new command string every call: an argument
  varies, so the shell-parse and SQL caches miss) and "warm" (the same string every call), with
  `corral.policy.shell.parse` alone and `sqlglot.parse_one` alone (SQL commands) on the same
  strings as the baseline: the share of parsing. Each verdict is checked against what the rules
  give.

The target is the in-engine decision bar, p99 < 200 µs, for the pure decision and for
the guardrail check (which the governor runs after the scope check, so the two add up).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import sqlglot

from corral.domain.agents import PolicyEvaluation
from corral.domain.governance import (
    Approval,
    ApprovalState,
    BudgetCeiling,
    DarkLaunch,
    KillSwitch,
    Pause,
    Period,
    PrerunVerdict,
    ScopeKind,
)
from corral.domain.ids import new_id
from corral.domain.models import Attempt, Claimed, Job, JobOptions, Limits, Permit
from corral.domain.settings import RoleSpec, Settings, TenantSpec
from corral.domain.states import AttemptState, DedupMode, JobState
from corral.policy import prerun, shell, sql
from corral.policy.guardrails import default_guardrails
from corral.runtime.assembly import settle_heap
from corral.runtime.gate import PrerunGate
from corral.store.sqlite import SqliteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from governance import environment, pct  # bench/governance.py: same conventions

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "policy.json"
TARGET_P99_US = 200.0
NOW = 1_795_000_000.0  # 2026-11-18 (UTC): the pure decision reads no clock

# --------------------------------------------------------------------------- helpers


def summary(wall: list[float], cpu: list[float] | None = None) -> dict[str, Any]:
    """p50/p99/max of wall-clock µs and, when given, p50/p99 of the thread's CPU µs (no time
    spent preempted: on a shared machine the wall tail is mostly other processes)."""
    out = {
        "n": len(wall),
        "p50_us": round(pct(wall, 0.5), 2),
        "p99_us": round(pct(wall, 0.99), 2),
        "max_us": round(max(wall), 2),
    }
    if cpu is not None:
        out |= {"cpu_p50_us": round(pct(cpu, 0.5), 2), "cpu_p99_us": round(pct(cpu, 0.99), 2)}
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall µs, CPU µs of this thread, result). The CPU clock is read outside the wall clock,
    so it adds its own cost (~1 µs here: `clock_overhead` in the JSON) to the CPU figure only."""
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    out = fn()
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    return (t1 - t0) / 1000, (c1 - c0) / 1000, out


class Samples:
    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def add(self, wall: float, cpu: float) -> None:
        self.wall.append(wall)
        self.cpu.append(cpu)

    def summary(self) -> dict[str, Any]:
        return summary(self.wall, self.cpu)


def clock_overhead(n: int) -> dict[str, Any]:
    """What timing an empty call costs (not subtracted from the figures)."""
    s = Samples()
    for _ in range(n):
        s.add(*timed(lambda: None)[:2])
    return s.summary()


# --------------------------------------------------------------------------- 1. pre-run


JOB = prerun.JobRef(id=new_id(), role="notebook", tenant="acme", workflow="nightly-eval")


def _switches() -> list[KillSwitch]:
    """20 switches of mixed scopes, none of which holds JOB back: 18 active for other tenants,
    roles and jobs, one global that was lifted, one for JOB's tenant that expired."""
    kinds = (ScopeKind.TENANT, ScopeKind.ROLE, ScopeKind.JOB)
    out = [
        KillSwitch(
            id=new_id(),
            scope=kinds[i % 3],
            target=new_id() if kinds[i % 3] is ScopeKind.JOB else f"other-{i}",
            reason="incident INC-7 under review",
            created_at=NOW - 3600 - i,
            created_by="ops@example.com",
            expires_at=None if i % 2 else NOW + 86_400,
        )
        for i in range(18)
    ]
    out.append(
        KillSwitch(
            id=new_id(),
            scope=ScopeKind.GLOBAL,
            target=None,
            reason="drill",
            created_at=NOW - 7200,
            created_by="ops@example.com",
            lifted_at=NOW - 7000,
        )
    )
    out.append(
        KillSwitch(
            id=new_id(),
            scope=ScopeKind.TENANT,
            target="acme",
            reason="spike",
            created_at=NOW - 5000,
            created_by="ops@example.com",
            expires_at=NOW - 100,
        )
    )
    return out


def _pauses(matching: bool) -> list[Pause]:
    out = [
        Pause(
            id=new_id(),
            scope=(ScopeKind.TENANT, ScopeKind.ROLE)[i % 2],
            target=f"other-{i}",
            reason="maintenance window",
            created_at=NOW - 600,
            created_by="ops@example.com",
        )
        for i in range(4)
    ]
    if matching:
        out.append(
            Pause(
                id=new_id(),
                scope=ScopeKind.ROLE,
                target="notebook",
                reason="cluster upgrade",
                created_at=NOW - 60,
                created_by="ops@example.com",
            )
        )
    return out


def _budgets() -> list[prerun.BudgetState]:
    return [
        prerun.BudgetState(
            ceiling=BudgetCeiling(
                scope=ScopeKind.TENANT, target="acme", period=Period.DAILY, ceiling_usd=500.0
            ),
            spent_usd=212.40,
            reserved_usd=18.0,
        ),
        prerun.BudgetState(
            ceiling=BudgetCeiling(
                scope=ScopeKind.ROLE, target="notebook", period=Period.MONTHLY, ceiling_usd=5_000.0
            ),
            spent_usd=3_120.75,
            reserved_usd=42.5,
        ),
        prerun.BudgetState(
            ceiling=BudgetCeiling(
                scope=ScopeKind.TENANT,
                target="acme",
                period=Period.ROLLING_30D,
                ceiling_usd=12_000.0,
            ),
            spent_usd=9_870.0,
            reserved_usd=60.0,
        ),
    ]


def _active() -> frozenset[str]:
    return frozenset([JOB.id, *(new_id() for _ in range(199))])  # 200, the job among them


DARK = DarkLaunch(workflow="nightly-eval", percentage=50)  # md5 position 28: inside
APPROVED = Approval(
    id=new_id(),
    job_id=JOB.id,
    subject=prerun.RUN_SUBJECT,
    digest="0" * 64,
    reason="approval_required",
    requested_at=NOW - 900,
    expires_at=NOW + 3600,
    state=ApprovalState.APPROVED,
    decided_at=NOW - 300,
    decided_by="lead@example.com",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    inp: prerun.PrerunInput
    verdict: PrerunVerdict
    step: prerun.Step


def scenarios() -> list[Scenario]:
    P = prerun.PrerunInput
    allow, none = PrerunVerdict.ALLOW, prerun.Step.NONE
    return [
        Scenario("no_switches", "nothing configured", P(job=JOB), allow, none),
        Scenario(
            "kill_switches_20",
            "20 kill switches, mixed scopes, none in scope",
            P(job=JOB, kill_switches=_switches()),
            allow,
            none,
        ),
        Scenario(
            "kill_switch_tenant",
            "the 20 + an active one on the job's tenant",
            P(
                job=JOB,
                kill_switches=[
                    *_switches(),
                    KillSwitch(
                        id=new_id(),
                        scope=ScopeKind.TENANT,
                        target="acme",
                        reason="runaway spend",
                        created_at=NOW - 30,
                        created_by="ops@example.com",
                    ),
                ],
            ),
            PrerunVerdict.DENY,
            prerun.Step.KILL_SWITCH,
        ),
        Scenario(
            "pause_role",
            "4 pauses elsewhere + one on the job's role",
            P(job=JOB, pauses=_pauses(True)),
            PrerunVerdict.PAUSE,
            prerun.Step.PAUSE,
        ),
        Scenario(
            "budgets_3",
            "3 ceilings (daily, monthly, rolling 30 d) with spend, room left",
            P(job=JOB, budgets=_budgets(), estimate_usd=2.5),
            allow,
            none,
        ),
        Scenario(
            "parallel_200",
            "200 active runs of the tenant (itself among them), limit 250",
            P(job=JOB, active_job_ids=_active(), max_parallel_runs=250),
            allow,
            none,
        ),
        Scenario(
            "dark_launch",
            "dark launch 50 %, workflow inside the window",
            P(job=JOB, dark_launch=DARK),
            allow,
            none,
        ),
        Scenario(
            "approval_role",
            "the role needs approval, none requested",
            P(job=JOB, approval_roles=frozenset({"notebook", "cluster"})),
            PrerunVerdict.REQUIRE_APPROVAL,
            prerun.Step.APPROVAL,
        ),
        Scenario(
            "all_clear",
            "all of the above that let it through: 20 switches, 4 pauses, "
            "3 budgets, 200 active, dark launch, approved",
            P(
                job=JOB,
                kill_switches=_switches(),
                pauses=_pauses(False),
                budgets=_budgets(),
                estimate_usd=2.5,
                active_job_ids=_active(),
                max_parallel_runs=250,
                dark_launch=DARK,
                approval_roles=frozenset({"notebook"}),
                approval=APPROVED,
            ),
            allow,
            none,
        ),
    ]


def bench_prerun(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sc in scenarios():
        for _ in range(50):  # warm up
            prerun.decide(sc.inp, NOW)
        samples = Samples()
        mismatches = 0
        d = prerun.decide(sc.inp, NOW)
        for _ in range(n):
            wall, cpu, d = timed(partial(prerun.decide, sc.inp, NOW))
            samples.add(wall, cpu)
            mismatches += d.verdict is not sc.verdict or d.step is not sc.step
        s = samples.summary()
        out[sc.name] = {
            "what": sc.what,
            **s,
            "verdict": d.verdict.value,
            "reason": d.reason.value,
            "step": d.step.value,
            "expected_verdict": sc.verdict.value,
            "expected_step": sc.step.value,
            "mismatches": mismatches,
            "snapshot_bytes": len(json.dumps(d.snapshot)),
            "meets_target": s["p99_us"] < TARGET_P99_US,
            "meets_target_cpu": s["cpu_p99_us"] < TARGET_P99_US,
        }
    return out


# --------------------------------------------------------------------------- 1b. the gate


def _job(tenant: str, role: str, now: float) -> Job:
    """A job; role `etl` jobs carry a workflow, so the gate looks up its dark launch (none)."""
    options = JobOptions(workflow="nightly-etl" if role == "etl" else None)
    return Job(
        id=new_id(),
        state=JobState.QUEUED,
        role=role,
        worker="command",
        env_name="local",
        priority=0,
        tenant=tenant,
        command=("python", "train.py"),
        prompt=None,
        cwd=None,
        env={},
        options=options,
        limits=Limits(),
        key=None,
        dedup=DedupMode.COALESCE,
        workspace=None,
        parent_id=None,
        depth=0,
        created_at=now,
        updated_at=now,
        sort_at=now,
    )


# (name, tenant, role, batch, verdict): the store holds a kill switch on tenant `halted` and a
# pause on role `batch`; tenant `capped` has a parallel limit and IN_FLIGHT runs, so each of its
# admissions reads the runs in flight (slow: it runs one round in PARALLEL_EVERY).
GATE_CASES = (
    ("allow", "acme", "notebook", 1, "allow"),
    ("allow_workflow", "acme", "etl", 1, "allow"),
    ("allow_parallel_limit", "capped", "notebook", 1, "allow"),
    ("deny_kill_switch", "halted", "notebook", 1, "deny"),
    ("pause", "acme", "batch", 1, "pause"),
    ("allow_batch_8", "acme", "notebook", 8, "allow"),
)
IN_FLIGHT = 200
PARALLEL_EVERY = 10
SETTINGS = Settings(
    roles={name: RoleSpec(name=name) for name in ("notebook", "etl", "batch")},
    environments={},
    tenants={"capped": TenantSpec(name="capped", max_parallel_runs=10**6)},
)


async def _in_flight(store: SqliteStore, tenant: str, n: int, now: float) -> None:
    """Submit n jobs of the tenant and claim their first attempts: runs the gate counts."""
    for _ in range(n):
        job = (await store.submit(_job(tenant, "notebook", now), now=now, aging_s=60.0)).job
        permit_id = new_id()
        attempt = Attempt(
            id=new_id(),
            job_id=job.id,
            index=1,
            state=AttemptState.STARTING,
            permit_id=permit_id,
            deadline_at=now + 3600,
            created_at=now,
            dir="/nonexistent",
            engine_id="bench",
        )
        permit = Permit(
            id=permit_id,
            job_id=job.id,
            attempt_index=1,
            issued_at=now,
            deadline_at=now + 3600,
            grace_s=10.0,
            granted={"role": "notebook"},
            breaker="closed",
            seal="bench",
        )
        won = await store.start_attempts(
            [Claimed(job=job, attempt=attempt, permit=permit)], now=now
        )
        assert len(won) == 1, "could not claim an in-flight attempt"


async def _admit(gate: PrerunGate, jobs: list[Job]) -> tuple[float, float, dict[str, Any]]:
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    got = await gate.admit(jobs, time.time())
    # an allow is written as the dispatcher writes it when no attempt starts with it (with
    # one, it goes into the attempts' transaction); a deny or a hold was written by `admit`
    await gate.record(gate.take_allowed())
    t1 = time.perf_counter_ns()
    c1 = time.thread_time_ns()
    return (t1 - t0) / 1000, (c1 - c0) / 1000, got


async def bench_gate(root: Path, n: int) -> dict[str, Any]:
    """The gate as the engine builds it (settings, the shipped guardrails: a command job's
    command is checked at spawn). The single-job cases and the store-append baseline run
    interleaved, one of each per round, so drift on a shared machine hits them alike; the batch
    case runs after them."""
    store = SqliteStore(root / "corral.db")
    await store.open()
    try:
        now = time.time()
        await store.activate_kill_switch(
            KillSwitch(
                id=new_id(),
                scope=ScopeKind.TENANT,
                target="halted",
                reason="runaway spend",
                created_at=now,
                created_by="ops@example.com",
            )
        )
        await store.activate_pause(
            Pause(
                id=new_id(),
                scope=ScopeKind.ROLE,
                target="batch",
                reason="cluster upgrade",
                created_at=now,
                created_by="ops@example.com",
            )
        )
        await _in_flight(store, "capped", IN_FLIGHT, now)
        assert len(await store.inflight()) == IN_FLIGHT
        gate = PrerunGate(store, SETTINGS, default_guardrails())
        for _name, tenant, role, batch, _verdict in GATE_CASES:  # warm up: not timed
            for _ in range(5):
                await _admit(gate, [_job(tenant, role, now) for _ in range(batch)])
        settle_heap()  # as the engine does once it has started
        # The baseline row: the allow evaluation the gate writes, appended alone.
        allowed = prerun.decide(
            prerun.PrerunInput(
                job=prerun.JobRef.of(_job("acme", "notebook", now)),
                kill_switches=gate._switches,
                pauses=gate._pauses,
            ),
            now,
        )
        samples = {name: Samples() for name, *_ in GATE_CASES}
        samples["store_append"] = Samples()
        mismatches = dict.fromkeys(samples, 0)
        refreshes = dict.fromkeys(samples, 0)
        written: dict[str, list[Job]] = {name: [] for name in samples}

        async def one(name: str, tenant: str, role: str, batch: int, verdict: str) -> None:
            jobs = [_job(tenant, role, now) for _ in range(batch)]
            read_at = gate._read_at
            wall, cpu, got = await _admit(gate, jobs)
            samples[name].add(wall, cpu)
            refreshes[name] += gate._read_at != read_at
            mismatches[name] += sum(a.verdict.value != verdict for a in got.values())
            written[name].extend(jobs)

        for i in range(n):
            for name, tenant, role, batch, verdict in GATE_CASES:
                if batch == 1 and (tenant != "capped" or i % PARALLEL_EVERY == 0):
                    await one(name, tenant, role, batch, verdict)
            e = PolicyEvaluation(
                at=time.time(),
                job_id=new_id(),
                attempt=1,
                stage=prerun.PRE_RUN_STAGE,
                subject=allowed.step.value,
                verdict=allowed.verdict.value,
                reason=allowed.reason.value,
                message=allowed.message,
                inputs=allowed.snapshot,
            )
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            await store.append_policy_evaluations([e])
            t1 = time.perf_counter_ns()
            samples["store_append"].add((t1 - t0) / 1000, (time.thread_time_ns() - c0) / 1000)
        for name, tenant, role, batch, verdict in GATE_CASES:
            if batch > 1:
                for _ in range(max(1, n // batch)):
                    await one(name, tenant, role, batch, verdict)
        out: dict[str, Any] = {}
        for name, tenant, role, batch, verdict in GATE_CASES:
            jobs = written[name]
            sample = jobs[:: max(1, len(jobs) // 25)]  # each call wrote its jobs' evaluation
            recorded = 0
            for job in sample:
                rows = await store.policy_evaluations(job.id)
                recorded += len(rows) == 1 and rows[0].verdict == verdict
            s = samples[name].summary()
            out[name] = {
                "tenant": tenant,
                "role": role,
                "jobs_per_call": batch,
                **s,
                "p50_us_per_job": round(s["p50_us"] / batch, 2),
                "expected_verdict": verdict,
                "mismatches": mismatches[name],
                "recorded_ok": recorded == len(sample),
                "recorded_checked": len(sample),
                "refreshes": refreshes[name],
            }
        out["store_append"] = {
            **samples["store_append"].summary(),
            "row_inputs_bytes": len(json.dumps(allowed.snapshot)),
        }
        return out
    finally:
        await store.close()


# --------------------------------------------------------------------------- 2. guardrails


@dataclass(frozen=True)
class GuardCase:
    role: str
    warm: str  # the command as given
    cold: str  # the same with one argument varying: {n}
    verdict: str
    reason: str
    rule: str | None
    sql: str | None = None  # the SQL inside (cold form), for the sqlglot baseline


SELECT = "SELECT region, sum(x) FROM prod.sales GROUP BY 1"
GUARD_CASES = (
    GuardCase(
        "notebook",
        "kubectl get pods -n ml",
        "kubectl get pods -n ml-{n}",
        "allow",
        "read_only",
        "kubectl-reads",
    ),
    GuardCase(
        "notebook",
        "kubectl delete pod trainer-0",
        "kubectl delete pod trainer-{n}",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    GuardCase(
        "notebook",
        "ray job submit --address http://ray:8265 -- python train.py",
        "ray job submit --address http://ray:8265 -- python train.py --seed {n}",
        "deny",
        "tool_redirected",
        "redirect-ray",
    ),
    GuardCase(
        "cluster",
        "helm upgrade web ./chart -f values.yaml",
        "helm upgrade web ./chart -f values-{n}.yaml",
        "allow",
        "no_rule_matched",
        None,
    ),
    GuardCase(
        "cluster",
        "helm uninstall web --force",
        "helm uninstall web-{n} --force",
        "require_approval",
        "helm_uninstall",
        "helm-uninstall-needs-approval",
    ),
    GuardCase(
        "wandb",
        "wandb sync ./run-1",
        "wandb sync ./run-{n}",
        "deny",
        "read_only_role",
        "wandb-read-only",
    ),
    GuardCase(
        "lakehouse",
        f"duckdb lake.duckdb -c '{SELECT}'",
        f"duckdb lake-{{n}}.duckdb -c '{SELECT}'",  # the catalog is part of the SQL key
        "allow",
        "sql_allowed",
        "protect-prod-duckdb",
        SELECT,
    ),
    GuardCase(
        "lakehouse",
        "duckdb lake.duckdb -c 'DELETE FROM prod.sales WHERE id = 7'",
        "duckdb lake.duckdb -c 'DELETE FROM prod.sales WHERE id = {n}'",
        "require_approval",
        "sql_delete_protected",
        "protect-prod-duckdb",
        "DELETE FROM prod.sales WHERE id = {n}",
    ),
    GuardCase(
        "notebook",
        "kubectl get pods | grep train && ray job status raysubmit_1",
        "kubectl get pods | grep train && ray job status raysubmit_{n}",
        "allow",
        "read_only",
        "kubectl-reads",
    ),
)


def _cache_hits() -> int:
    """Hits of the two parse caches a guardrail check goes through (shell text, SQL text)."""
    return shell.parse.cache_info().hits + sql._check.cache_info().hits


def bench_guardrails(n_cold: int, n_warm: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    rules = default_guardrails()  # YAML load and rule checks, once per process
    load_ms = (time.perf_counter() - t0) * 1000
    serial = iter(range(1_000, 10**9))  # never the same cold string twice in the run
    cases: list[dict[str, Any]] = []
    for case in GUARD_CASES:

        def check(command: str, case: GuardCase = case) -> tuple[float, float, bool]:
            wall, cpu, v = timed(
                lambda: rules.evaluate(case.role, "tool_call", "Bash", {"command": command})
            )
            want = (case.verdict, case.reason, case.rule)
            return wall, cpu, (v.verdict, v.reason, v.rule_id) == want

        check(case.warm)  # rule index and program grammar built once per program: not timed
        cold, warm, parse, sq = Samples(), Samples(), Samples(), Samples()
        mismatches = cold_hits = 0
        for _ in range(n_cold):  # the baselines interleaved with the cold calls: same drift
            hits = _cache_hits()
            wall, cpu, ok = check(case.cold.format(n=next(serial)))
            cold_hits += _cache_hits() - hits
            cold.add(wall, cpu)
            mismatches += not ok
            parse.add(*timed(partial(shell.parse, case.cold.format(n=next(serial))))[:2])
            if case.sql is not None:
                text = case.sql.format(n=next(serial))
                sq.add(*timed(partial(sqlglot.parse_one, text, read="duckdb"))[:2])
        hits = _cache_hits()
        for _ in range(n_warm):
            wall, cpu, ok = check(case.warm)
            warm.add(wall, cpu)
            mismatches += not ok
        warm_hits = _cache_hits() - hits
        v = rules.evaluate(case.role, "tool_call", "Bash", {"command": case.warm})
        row: dict[str, Any] = {
            "role": case.role,
            "command": case.warm,
            "cold_form": case.cold,
            "verdict": v.verdict,
            "reason": v.reason,
            "rule": v.rule_id,
            "expected": [case.verdict, case.reason, case.rule],
            "mismatches": mismatches,
            "cold_cache_hits": cold_hits,
            "warm_cache_hits": warm_hits,
            "cold": cold.summary(),
            "warm": warm.summary(),
            "shell_parse": parse.summary(),
        }
        parse_p50 = row["shell_parse"]["p50_us"]
        if case.sql is not None:
            row["sqlglot_parse_one"] = sq.summary()
            parse_p50 += row["sqlglot_parse_one"]["p50_us"]
        row["parse_share_p50"] = round(parse_p50 / row["cold"]["p50_us"], 2)
        row["meets_target"] = max(row["cold"]["p99_us"], row["warm"]["p99_us"]) < TARGET_P99_US
        row["meets_target_cpu"] = (
            max(row["cold"]["cpu_p99_us"], row["warm"]["cpu_p99_us"]) < TARGET_P99_US
        )
        cases.append(row)
    return {"rules_load_ms": round(load_ms, 1), "cases": cases}


# --------------------------------------------------------------------------- reporting


def _mark(r: dict[str, Any]) -> str:
    """PASS / MISS on the wall-clock p99; a MISS says whether the CPU-time p99 would pass (the
    tail was preemption by other processes) or not (the code's own tail)."""
    if r["meets_target"]:
        return "PASS"
    return "MISS (cpu PASS)" if r["meets_target_cpu"] else "MISS"


def _us(r: dict[str, Any]) -> str:
    """p50/p99 (CPU p99) of one summary."""
    return f"{r['p50_us']:.1f}/{r['p99_us']:.1f} ({r['cpu_p99_us']:.0f})"


def print_report(
    pre: dict[str, Any], gate: dict[str, Any], guard: dict[str, Any], clock: dict[str, Any]
) -> None:
    head = (
        f"{'pre-run decide(), scenario':<20} {'verdict':<35} {'p50 µs':>7} {'p99 µs':>8} "
        f"{'cpu p99':>8} {'max µs':>8}  {'target':<13} result"
    )
    print(head)
    print("-" * len(head))
    for name, r in pre.items():
        verdict = f"{r['verdict']}/{r['reason']}"
        print(
            f"{name:<20} {verdict:<35} {r['p50_us']:>7.1f} {r['p99_us']:>8.1f} "
            f"{r['cpu_p99_us']:>8.1f} {r['max_us']:>8.1f}  {'p99 < 200 µs':<13} "
            f"{_mark(r)}{'' if not r['mismatches'] else '  WRONG VERDICT'}"
        )
    print(
        f"({next(iter(pre.values()))['n']} decisions per scenario, input built once, only "
        "decide() timed; cpu p99 = this thread's CPU time, without preemption)"
    )
    print()
    head = (
        f"{'PrerunGate.admit(), durable write incl.':<40} {'p50 µs':>7} {'p99 µs':>8} "
        f"{'cpu p99':>8} {'max µs':>8} {'p50/job':>8} {'refresh':>7}"
    )
    print(head)
    print("-" * len(head))
    rows = [
        (f"{name} ({batch} job{'s' if batch > 1 else ''}/call, {verdict})", gate[name])
        for name, _t, _r, batch, verdict in GATE_CASES
    ]
    rows.append(("baseline: store append of one row", gate["store_append"]))
    for label, r in rows:
        per_job = f"{r['p50_us_per_job']:>8.1f} {r['refreshes']:>7}" if "refreshes" in r else ""
        bad = "refreshes" in r and (r["mismatches"] or not r["recorded_ok"])
        print(
            f"{label:<40} {r['p50_us']:>7.1f} {r['p99_us']:>8.1f} {r['cpu_p99_us']:>8.1f} "
            f"{r['max_us']:>8.1f} {per_job}{'  WRONG' if bad else ''}"
        )
    print(
        f"(real SQLite store, WAL, synchronous=NORMAL: a kill switch on tenant `halted`, a "
        f"pause on role `batch`, {IN_FLIGHT} runs in flight\n of tenant `capped` (parallel "
        f"limit; one round in {PARALLEL_EVERY}); the shipped guardrails check each job's "
        "command at spawn; every call appends\n its jobs' pre-run evaluations before it "
        "returns; single-job cases and the baseline interleaved; refresh = calls that\n "
        "re-read switches, pauses and budgets, every 0.5 s)"
    )
    print()
    head = (
        f"{'guardrail check (role: command)':<52} {'verdict':<16} "
        f"{'cold p50/p99 (cpu)':>21} {'warm p50/p99 (cpu)':>20} {'parse p50':>10} "
        f"{'share':>5}  result"
    )
    print(head)
    print("-" * len(head))
    for r in guard["cases"]:
        cmd = r["command"] if len(r["command"]) <= 40 else r["command"][:37] + "..."
        parse = f"{r['shell_parse']['p50_us']:.0f}"
        if "sqlglot_parse_one" in r:
            parse += f"+{r['sqlglot_parse_one']['p50_us']:.0f}"
        wrong = "" if not r["mismatches"] and not r["cold_cache_hits"] else "  WRONG"
        print(
            f"{r['role'] + ': ' + cmd:<52} {r['verdict']:<16} {_us(r['cold']):>21} "
            f"{_us(r['warm']):>20} {parse:>10} {r['parse_share_p50']:>5.2f}  "
            f"{_mark(r)}{wrong}"
        )
    first = guard["cases"][0]
    print(
        f"(target p99 < 200 µs, cold and warm; {first['cold']['n']} cold and "
        f"{first['warm']['n']} warm calls per command; parse = shell.parse [+ "
        f"sqlglot.parse_one]\n alone on cold strings; share = parse p50 ÷ cold p50; rules "
        f"loaded in {guard['rules_load_ms']} ms; an empty timed call costs "
        f"{clock['p50_us']:.2f} µs wall, {clock['cpu_p50_us']:.2f} µs cpu)"
    )
    print("verdicts (checked on every call):")
    for r in guard["cases"]:
        print(
            f"  {r['role']:<9} {r['verdict']:<16} {r['reason']:<27} {r['rule'] or '-':<29} "
            f"{r['command']}"
        )


# --------------------------------------------------------------------------- collector


def collection_pause(rounds: int = 5) -> dict[str, Any]:
    """What a full garbage collection stalls a serving process for, with this process's heap
    (every module and grammar the engine loads, a gate built), before and after the engine's
    `settle_heap()`; the fastest of a few rounds each."""
    default_guardrails().check_sql("lakehouse", "DELETE FROM prod.sales WHERE id = 7")

    def fastest() -> float:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            gc.collect()
            times.append((time.perf_counter_ns() - t0) / 1e6)
        return min(times)

    before, tracked = fastest(), len(gc.get_objects())
    settle_heap()
    after = fastest()
    gc.unfreeze()  # the gate bench settles its own heap, after its warm-up
    return {"before_ms": round(before, 3), "after_ms": round(after, 3), "objects": tracked}


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON summary to write")
    args = ap.parse_args(argv)
    env = environment()
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    started = time.perf_counter()
    clock = clock_overhead(2_000)
    collector = collection_pause()
    pre = bench_prerun(500 if args.quick else 20_000)
    with tempfile.TemporaryDirectory(prefix="corral-policy-bench-") as d:
        gate = anyio.run(bench_gate, Path(d), 100 if args.quick else 1_000)
    guard = bench_guardrails(200 if args.quick else 2_000, 500 if args.quick else 10_000)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    env["elapsed_s"] = round(time.perf_counter() - started, 1)
    ok = (
        all(r["mismatches"] == 0 for r in pre.values())
        and all(
            r["mismatches"] == 0 and r["recorded_ok"]
            for k, r in gate.items()
            if k != "store_append"
        )
        and all(r["mismatches"] == 0 and r["cold_cache_hits"] == 0 for r in guard["cases"])
    )
    result = {
        "environment": env,
        "quick": args.quick,
        "ok": ok,
        "target_p99_us": TARGET_P99_US,
        "clock_overhead": clock,
        "prerun": pre,
        "gate": gate,
        "guardrails": guard,
        "collection_pause": collector,
    }
    print()
    print_report(pre, gate, guard, clock)
    print(
        f"\nfull garbage collection (an event-loop stall): {collector['before_ms']:.2f} ms "
        f"over {collector['objects']} start-up objects; {collector['after_ms']:.2f} ms after "
        "settle_heap() (the engine and the core freeze their start-up heap)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {args.out} ({env['elapsed_s']} s)")
    if not ok:
        print(
            "ERROR: a verdict differs from what the policy says, or a cold call hit a "
            "parse cache (see WRONG above)",
            file=sys.stderr,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
