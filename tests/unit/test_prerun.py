"""Pre-run policy: the seven steps in order, budgets, dark launch vectors, the incident breaker."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any

import pytest

from corral.domain.governance import (
    Approval,
    ApprovalState,
    BudgetCeiling,
    DarkLaunch,
    KillSwitch,
    Pause,
    Period,
    PrerunVerdict,
    Reason,
    ScopeKind,
    Severity,
)
from corral.domain.models import JobOptions
from corral.policy.prerun import (
    BudgetState,
    JobRef,
    PrerunInput,
    Step,
    commit,
    crossed,
    dark_launch_position,
    decide,
    in_dark_launch_window,
    period_end,
    period_start,
    release,
    reserve,
    should_pause,
    workflow_of,
)
from tests.unit.test_retry import job as make_job

NOW = 1_760_000_000.0
JOB = JobRef(id="j1", role="coder", tenant="acme", workflow="nightly-eval")  # position 28
G, T, R, J = ScopeKind.GLOBAL, ScopeKind.TENANT, ScopeKind.ROLE, ScopeKind.JOB


def switch(scope: ScopeKind = G, target: str | None = None, **kw: Any) -> KillSwitch:
    return KillSwitch(
        id=kw.pop("id", "ks1"),
        scope=scope,
        target=target,
        reason="incident 7",
        created_at=NOW - 60,
        created_by="ops",
        **kw,
    )


def pause(scope: ScopeKind = G, target: str | None = None, **kw: Any) -> Pause:
    return Pause(
        id="p1",
        scope=scope,
        target=target,
        reason="maintenance",
        created_at=NOW - 60,
        created_by="ops",
        **kw,
    )


def budget(
    spent: float,
    reserved: float = 0.0,
    ceiling: float = 10.0,
    scope: ScopeKind = T,
    target: str = "acme",
    period: Period = Period.MONTHLY,
) -> BudgetState:
    return BudgetState(
        ceiling=BudgetCeiling(scope=scope, target=target, period=period, ceiling_usd=ceiling),
        spent_usd=spent,
        reserved_usd=reserved,
    )


def approval(
    state: ApprovalState = ApprovalState.PENDING,
    expires_at: float = NOW + 3600,
    job_id: str = "j1",
    subject: str = "run",
) -> Approval:
    return Approval(
        id="ap1",
        job_id=job_id,
        subject=subject,
        digest=hashlib.sha256(subject.encode()).hexdigest(),
        reason="role_requires",
        requested_at=NOW - 10,
        expires_at=expires_at,
        state=state,
        decided_by="alice" if state is not ApprovalState.PENDING else None,
    )


def inp(**kw: Any) -> PrerunInput:
    return PrerunInput(job=kw.pop("job", JOB), **kw)


ALLOW = (PrerunVerdict.ALLOW, Reason.ALLOWED, Step.NONE)
KILL = (PrerunVerdict.DENY, Reason.KILL_SWITCH_ACTIVE, Step.KILL_SWITCH)
PAUSED = (PrerunVerdict.PAUSE, Reason.RUNNER_PAUSED, Step.PAUSE)
BUDGET = (PrerunVerdict.DENY, Reason.BUDGET_CEILING_EXCEEDED, Step.BUDGET)
PARALLEL = (PrerunVerdict.DENY, Reason.MAX_PARALLEL_RUNS_EXCEEDED, Step.PARALLEL_LIMIT)
DARK = (PrerunVerdict.DENY, Reason.DARK_LAUNCH_EXCLUDED, Step.DARK_LAUNCH)
NEEDS_APPROVAL = (PrerunVerdict.REQUIRE_APPROVAL, Reason.APPROVAL_REQUIRED, Step.APPROVAL)
APPROVAL_DENY = (PrerunVerdict.DENY, Reason.APPROVAL_POLICY_DENY, Step.APPROVAL)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        pytest.param({}, ALLOW, id="nothing-set"),
        # 1. kill switch, by scope; expired and lifted switches do not count
        pytest.param({"kill_switches": [switch()]}, KILL, id="kill-global"),
        pytest.param({"kill_switches": [switch(T, "acme")]}, KILL, id="kill-tenant"),
        pytest.param({"kill_switches": [switch(R, "coder")]}, KILL, id="kill-role"),
        pytest.param({"kill_switches": [switch(J, "j1")]}, KILL, id="kill-job"),
        pytest.param(
            {"kill_switches": [switch(T, "other"), switch(R, "reviewer"), switch(J, "j2")]},
            ALLOW,
            id="kill-other-scopes",
        ),
        pytest.param({"kill_switches": [switch(T, None)]}, ALLOW, id="kill-tenant-without-target"),
        pytest.param({"kill_switches": [switch(expires_at=NOW)]}, ALLOW, id="kill-expired-now"),
        pytest.param(
            {"kill_switches": [switch(expires_at=NOW + 1)]}, KILL, id="kill-expires-later"
        ),
        pytest.param({"kill_switches": [switch(lifted_at=NOW - 1)]}, ALLOW, id="kill-lifted"),
        # 2. pause
        pytest.param({"pauses": [pause()]}, PAUSED, id="pause-global"),
        pytest.param({"pauses": [pause(T, "acme")]}, PAUSED, id="pause-tenant"),
        pytest.param({"pauses": [pause(R, "coder")]}, PAUSED, id="pause-role"),
        pytest.param({"pauses": [pause(T, "other")]}, ALLOW, id="pause-other-tenant"),
        pytest.param({"pauses": [pause(resumed_at=NOW - 1)]}, ALLOW, id="pause-resumed"),
        # 3. budget: spent + reserved + this job's reservation > ceiling
        pytest.param(
            {"budgets": [budget(6, 3)], "estimate_usd": 1.0}, ALLOW, id="budget-exact-fit"
        ),
        pytest.param({"budgets": [budget(6, 3)], "estimate_usd": 1.01}, BUDGET, id="budget-over"),
        pytest.param(
            {"budgets": [budget(6, 4)], "estimate_usd": 0.0},
            BUDGET,
            id="budget-exhausted-zero-estimate",
        ),
        pytest.param({"budgets": [budget(11)]}, BUDGET, id="budget-overspent"),
        pytest.param({"budgets": [budget(0, ceiling=0)]}, BUDGET, id="budget-zero-ceiling"),
        pytest.param(
            {"budgets": [budget(9, scope=R, target="coder")], "estimate_usd": 2.0},
            BUDGET,
            id="budget-role",
        ),
        pytest.param(
            {
                "budgets": [budget(9, target="other"), budget(9, scope=R, target="x")],
                "estimate_usd": 2.0,
            },
            ALLOW,
            id="budget-other-scopes-ignored",
        ),
        pytest.param(
            {"budgets": [budget(1), budget(9.5, scope=R, target="coder")], "estimate_usd": 1.0},
            BUDGET,
            id="budget-any-ceiling",
        ),
        # 4. parallel runs, never counting the job itself
        pytest.param(
            {"active_job_ids": frozenset({"j1"}), "max_parallel_runs": 1},
            ALLOW,
            id="parallel-self-not-counted",
        ),
        pytest.param(
            {"active_job_ids": frozenset({"j1", "j2"}), "max_parallel_runs": 2},
            ALLOW,
            id="parallel-below-limit-with-self",
        ),
        pytest.param(
            {"active_job_ids": frozenset({"j2"}), "max_parallel_runs": 1},
            PARALLEL,
            id="parallel-at-limit",
        ),
        pytest.param(
            {"active_job_ids": frozenset({"j1", "j2", "j3"}), "max_parallel_runs": 2},
            PARALLEL,
            id="parallel-over-limit",
        ),
        pytest.param(
            {"active_job_ids": frozenset(), "max_parallel_runs": 0}, PARALLEL, id="parallel-zero"
        ),
        pytest.param(
            {"active_job_ids": frozenset({"a", "b", "c"})}, ALLOW, id="parallel-unlimited"
        ),
        # 5. dark launch: nightly-eval has position 28
        pytest.param(
            {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=28)},
            DARK,
            id="dark-at-position",
        ),
        pytest.param(
            {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=29)},
            ALLOW,
            id="dark-above-position",
        ),
        pytest.param(
            {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=0)}, DARK, id="dark-zero"
        ),
        pytest.param(
            {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=100)},
            ALLOW,
            id="dark-hundred",
        ),
        pytest.param(
            {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=0, enabled=False)},
            ALLOW,
            id="dark-disabled",
        ),
        # 6. approval
        pytest.param({"approval_roles": frozenset({"coder"})}, NEEDS_APPROVAL, id="approval-role"),
        pytest.param({"approval_roles": frozenset({"reviewer"})}, ALLOW, id="approval-other-role"),
        pytest.param({"approval": approval()}, NEEDS_APPROVAL, id="approval-pending"),
        pytest.param(
            {"approval_roles": frozenset({"coder"}), "approval": approval(ApprovalState.APPROVED)},
            ALLOW,
            id="approval-approved",
        ),
        pytest.param(
            {"approval_roles": frozenset({"coder"}), "approval": approval(ApprovalState.DENIED)},
            APPROVAL_DENY,
            id="approval-denied",
        ),
        pytest.param(
            {"approval": approval(ApprovalState.EXPIRED)},
            APPROVAL_DENY,
            id="approval-expired-state",
        ),
        pytest.param(
            {"approval": approval(expires_at=NOW)}, APPROVAL_DENY, id="approval-pending-past-expiry"
        ),
        pytest.param(
            {"approval": approval(ApprovalState.APPROVED, expires_at=NOW - 1)},
            ALLOW,
            id="approval-approved-before-expiry-stands",
        ),
    ],
)
def test_each_step(kw: dict[str, Any], expected: tuple[PrerunVerdict, Reason, Step]) -> None:
    d = decide(inp(**kw), NOW)
    assert (d.verdict, d.reason, d.step) == expected, d.message
    assert d.message and "\n" not in d.message
    assert json.loads(json.dumps(d.snapshot)) == d.snapshot  # JSON-safe as it is


EVERYTHING: dict[str, Any] = {
    "kill_switches": [switch()],
    "pauses": [pause()],
    "budgets": [budget(10)],
    "active_job_ids": frozenset({"j2"}),
    "max_parallel_runs": 1,
    "dark_launch": DarkLaunch(workflow="nightly-eval", percentage=10),
    "approval_roles": frozenset({"coder"}),
}
ORDER = [
    ("kill_switches", KILL),
    ("pauses", PAUSED),
    ("budgets", BUDGET),
    ("max_parallel_runs", PARALLEL),
    ("dark_launch", DARK),
    ("approval_roles", NEEDS_APPROVAL),
]


def test_first_match_wins_in_the_documented_order() -> None:
    kw = dict(EVERYTHING)
    for key, expected in ORDER:
        d = decide(inp(**kw), NOW)
        assert (d.verdict, d.reason, d.step) == expected
        del kw[key]
    assert decide(inp(**kw), NOW).verdict is PrerunVerdict.ALLOW


def test_a_deny_snapshots_only_the_step_that_decided() -> None:
    d = decide(inp(active_job_ids=frozenset({"j1", "j2"}), max_parallel_runs=1), NOW)
    assert d.snapshot == {
        "job": {"id": "j1", "role": "coder", "tenant": "acme", "workflow": "nightly-eval"},
        "now": NOW,
        "parallel_limit": {
            "tenant": "acme",
            "max_parallel_runs": 1,
            "active_runs": 1,
            "active_job_ids": ["j2"],
            "self_excluded": True,
        },
    }


def test_an_allow_snapshots_every_step() -> None:
    d = decide(
        inp(
            budgets=[budget(2, 1)],
            estimate_usd=0.5,
            dark_launch=DarkLaunch(workflow="nightly-eval", percentage=50),
        ),
        NOW,
    )
    assert d.verdict is PrerunVerdict.ALLOW
    assert set(d.snapshot) == {
        "job",
        "now",
        "kill_switch",
        "pause",
        "budget",
        "parallel_limit",
        "dark_launch",
        "approval",
    }
    assert d.snapshot["dark_launch"] == {
        "workflow": "nightly-eval",
        "enabled": True,
        "percentage": 50,
        "position": 28,
        "included": True,
    }
    [ceiling] = d.snapshot["budget"]["ceilings"]
    assert ceiling["headroom_usd"] == 7 and ceiling["admits"] is True
    assert ceiling["period_start"] == period_start(Period.MONTHLY, NOW)


def test_kill_switch_snapshot_names_the_switch() -> None:
    d = decide(inp(kill_switches=[switch(T, "acme", id="ks9", expires_at=NOW + 5)]), NOW)
    [s] = d.snapshot["kill_switch"]["active_in_scope"]
    assert s["id"] == "ks9" and s["scope"] == "tenant" and s["expires_at"] == NOW + 5
    assert "ks9" in d.message and "incident 7" in d.message


def test_decide_is_pure() -> None:
    i = inp(**EVERYTHING)
    assert decide(i, NOW) == decide(i, NOW)


@pytest.mark.parametrize(
    "kw",
    [
        {"dark_launch": DarkLaunch(workflow="other", percentage=50)},
        {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=101)},
        {"dark_launch": DarkLaunch(workflow="nightly-eval", percentage=-1)},
        {"approval": approval(job_id="j2")},
        {"approval": approval(subject="rm -rf /tmp/x")},  # a tool call's approval, not the run's
        {"estimate_usd": -1.0},
        {"max_parallel_runs": -1},
    ],
)
def test_inconsistent_input_is_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        inp(**kw)


def test_a_job_without_workflow_is_never_dark_launched() -> None:
    d = decide(inp(job=replace(JOB, workflow=None)), NOW)
    assert d.verdict is PrerunVerdict.ALLOW
    assert d.snapshot["dark_launch"] == {"workflow": None, "enabled": False}


@pytest.mark.parametrize(
    ("options", "key", "expected"),
    [
        ({"workflow": "nightly"}, "nightly-2026-01-01", "nightly"),  # explicit option wins
        ({}, "nightly-2026-01-01", "nightly-2026-01-01"),
        ({"workflow": ""}, "k", "k"),
        ({"workflow": 7}, None, None),  # not a string: ignored
        ({}, None, None),
    ],
)
def test_workflow_of_a_job(options: dict[str, Any], key: str | None, expected: str | None) -> None:
    j = make_job(
        options=JobOptions.from_json(options), key=key, id="j9", role="coder", tenant="acme"
    )
    assert workflow_of(j) == expected
    assert JobRef.of(j) == JobRef(id="j9", role="coder", tenant="acme", workflow=expected)


# ---- dark launch vectors ----------------------------------------------------------------------

# workflow, md5 hex, first 32 bits hex, unsigned, position: docs/reference/dark-launch.md
VECTORS = [
    (
        "00000000-0000-0000-0000-000000000001",
        "c96589eefb0828c07179095bcd0cef5f",
        "c96589ee",
        3378874862,
        62,
    ),
    ("wf_abc123", "90032863a0dea4dd586cd079ad9e308d", "90032863", 2416126051, 51),
    (
        "11111111-2222-3333-4444-555555555555",
        "c6426b96020dfc0cac3adc1cf3952797",
        "c6426b96",
        3326241686,
        86,
    ),
    ("nightly-eval", "f8de50bc934fae304441f555a2c7defb", "f8de50bc", 4175319228, 28),
    ("deploy-canary", "d5bcfb7229271149b3653093b265e011", "d5bcfb72", 3585932146, 46),
    ("modèle-ü", "9d8d9e95b92ba4bbc158e2da7ace6cf0", "9d8d9e95", 2643304085, 85),
    ("wf_a", "0673c83aa1669dec0bcc60a5dc059db8", "0673c83a", 108251194, 94),
    ("wf_b", "13cf4fb44c3433771751c5c9635394a6", "13cf4fb4", 332353460, 60),
    ("ingest/daily", "3d5192acdafccd332d45da9a01764ce1", "3d5192ac", 1028756140, 40),
    ("workflow-42", "315a36c5061418b10313d3456136a574", "315a36c5", 827995845, 45),
    ("a", "0cc175b9c0f1b6a831c399e269772661", "0cc175b9", 214005177, 77),
]
DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "dark-launch.md"


@pytest.mark.parametrize(("workflow", "md5_hex", "first_hex", "first", "position"), VECTORS)
def test_dark_launch_vectors(
    workflow: str, md5_hex: str, first_hex: str, first: int, position: int
) -> None:
    assert hashlib.md5(workflow.encode()).hexdigest() == md5_hex
    assert md5_hex[:8] == first_hex and int(first_hex, 16) == first
    assert dark_launch_position(workflow) == position
    assert in_dark_launch_window(workflow, position + 1)
    assert not in_dark_launch_window(workflow, position)


def test_vectors_include_a_high_first_byte_and_never_go_negative() -> None:
    high = [v for v in VECTORS if int(v[2][:2], 16) >= 0x80]
    assert len(high) >= 4
    for workflow, _md5, first_hex, _first, position in high:
        signed = int.from_bytes(bytes.fromhex(first_hex), "big", signed=True)
        assert signed < 0  # the defect: read signed, the position would be negative
        assert 0 <= dark_launch_position(workflow) == position
    assert all(0 <= dark_launch_position(f"wf-{i}") < 100 for i in range(5000))


def test_the_docs_publish_the_same_vectors() -> None:
    rows = re.findall(
        r"^\| `([^`]*)` \| `([0-9a-f]{32})` \| `([0-9a-f]{8})` \| (\d+) \| (\d+) \|$",
        DOC.read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    assert [(w, m, f, int(n), int(p)) for w, m, f, n, p in rows] == VECTORS
    assert len(rows) >= 8


# ---- budgets ----------------------------------------------------------------------------------


def test_reserve_admits_only_what_fits() -> None:
    s = budget(4, 2)
    ok, s2 = reserve(s, 4.0)
    assert ok and s2.reserved_usd == 6 and s2.headroom_usd == 0
    ok, s3 = reserve(s2, 0.0)
    assert not ok and s3 is s2  # no room: not even a zero reservation
    ok, s4 = reserve(s, 4.01)
    assert not ok and s4 is s
    with pytest.raises(ValueError):
        reserve(s, -1.0)


def test_parallel_reservations_cannot_overshoot() -> None:
    s = budget(0, ceiling=10)
    admitted = 0
    for _ in range(10):  # ten parallel runs each asking for 3
        ok, s = reserve(s, 3.0)
        admitted += ok
    assert admitted == 3 and s.spent_usd + s.reserved_usd <= 10


def test_commit_replaces_the_reservation_and_release_gives_it_back() -> None:
    _, s = reserve(budget(1), 3.0)
    assert commit(s, 3.0, 2.5) == budget(3.5, 0)
    assert release(s, 3.0) == budget(1, 0)


@pytest.mark.parametrize(
    ("spent", "reserved", "own", "cost", "expected"),
    [
        (4, 5, 5, 5.9, False),  # 4 spent + 0 held by others + 5.9 ≤ 10
        (4, 5, 5, 6.0, False),  # exactly at the ceiling is not over it
        (4, 5, 5, 6.01, True),
        (4, 5, 0, 1.01, True),  # a state without this attempt's hold: others hold 5
        (0, 8, 2, 4.0, False),  # others hold 6
        (0, 8, 2, 4.5, True),
    ],
)
def test_crossed_mid_run(
    spent: float, reserved: float, own: float, cost: float, expected: bool
) -> None:
    assert crossed(budget(spent, reserved), cost, own_reservation=own) is expected


def ts(y: int, m: int, d: int, hh: int = 0, mm: int = 0, ss: int = 0, tz: tzinfo = UTC) -> float:
    return datetime(y, m, d, hh, mm, ss, tzinfo=tz).timestamp()


@pytest.mark.parametrize(
    ("period", "now", "start", "end"),
    [
        (Period.DAILY, ts(2026, 3, 14, 15, 9, 26), ts(2026, 3, 14), ts(2026, 3, 15)),
        (Period.DAILY, ts(2026, 3, 14), ts(2026, 3, 14), ts(2026, 3, 15)),
        (Period.MONTHLY, ts(2026, 3, 14, 15, 9), ts(2026, 3, 1), ts(2026, 4, 1)),
        (Period.MONTHLY, ts(2026, 12, 31, 23, 59), ts(2026, 12, 1), ts(2027, 1, 1)),
        (Period.MONTHLY, ts(2024, 2, 29, 12), ts(2024, 2, 1), ts(2024, 3, 1)),
        (Period.ROLLING_30D, ts(2026, 3, 14, 15), ts(2026, 2, 12, 15), ts(2026, 3, 14, 15)),
    ],
)
def test_period_bounds(period: Period, now: float, start: float, end: float) -> None:
    assert period_start(period, now) == start
    assert period_end(period, now) == end


def test_period_start_in_another_zone() -> None:
    est = timezone(timedelta(hours=-5))
    now = ts(2026, 3, 1, 3)  # 22:00 on Feb 28 in UTC−5
    assert period_start(Period.DAILY, now, est) == ts(2026, 2, 28, tz=est)
    assert period_start(Period.MONTHLY, now, est) == ts(2026, 2, 1, tz=est)


# ---- the incident-rate breaker ----------------------------------------------------------------

H, M, L, C = Severity.HIGH, Severity.MEDIUM, Severity.LOW, Severity.CRITICAL


@pytest.mark.parametrize(
    ("marks", "min_severity", "expected"),
    [
        ([], M, []),
        ([(NOW - 1, T, "acme", H)] * 3, M, [(T, "acme")]),
        ([(NOW - 1, T, "acme", H)] * 2, M, []),  # below the threshold
        ([(NOW - 1, T, "acme", L)] * 5, M, []),  # below the severity
        ([(NOW - 1, T, "acme", C), (NOW - 2, T, "acme", M), (NOW, T, "acme", H)], M, [(T, "acme")]),
        ([(NOW - 60, T, "acme", H)] * 5, M, []),  # the window is (now − 60, now]
        ([(NOW + 1, T, "acme", H)] * 5, M, []),  # not yet
        (
            [(NOW - 1, T, "acme", H), (NOW - 1, T, "beta", H), (NOW - 1, R, "acme", H)] * 3,
            H,
            [(R, "acme"), (T, "acme"), (T, "beta")],
        ),
        (
            [(NOW - 1, G, None, H), (NOW - 1, G, "ignored", H), (NOW - 1, G, None, H)],
            M,
            [(G, None)],
        ),
    ],
)
def test_should_pause(
    marks: list[tuple[float, ScopeKind, str | None, Severity]],
    min_severity: Severity,
    expected: list[tuple[ScopeKind, str | None]],
) -> None:
    assert should_pause(marks, NOW, 60.0, 3, min_severity) == expected


def test_should_pause_refuses_a_meaningless_threshold() -> None:
    with pytest.raises(ValueError):
        should_pause([], NOW, 60.0, 0, Severity.LOW)
