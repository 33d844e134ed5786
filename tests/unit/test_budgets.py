"""Budgets at permit time: token buckets per role / worker kind / provider, cost per tenant."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from corral.config_models import parse, resolve
from corral.core.budgets import CostLedger, TokenBucket, period_bounds
from corral.core.permits import BUDGET_EXHAUSTED, RATE_LIMIT
from corral.domain.errors import ConfigError
from corral.domain.models import JobOptions
from corral.domain.settings import (
    CostPeriod,
    ProviderSpec,
    RateSpec,
    RoleSpec,
    TenantSpec,
    WorkerSpec,
)
from tests.unit.test_permits import failed, granted, make_core, ok, refused, run, settings
from tests.unit.test_retry import job


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("takes", "at", "level", "wait"),
    [
        ([], 0.0, 3.0, 0.0),  # a new bucket is full
        ([0.0, 0.0, 0.0], 0.0, 0.0, 0.5),
        ([0.0, 0.0, 0.0], 0.25, 0.5, 0.25),
        ([0.0, 0.0, 0.0], 0.5, 1.0, 0.0),
        ([0.0, 0.0, 0.0], 100.0, 3.0, 0.0),  # never more than the burst
        ([0.0, 0.0, 0.0, 0.5], 0.5, 0.0, 0.5),
    ],
)
def test_token_bucket(takes: list[float], at: float, level: float, wait: float) -> None:
    b = TokenBucket(per_s=2.0, burst=3)
    for t in takes:
        b.take(t)
    assert b.level(at) == pytest.approx(level)
    assert b.wait_s(at) == pytest.approx(wait)


RATE = RateSpec(per_s=0.5, burst=2)


@pytest.mark.parametrize(
    ("changes", "options", "bucket"),
    [
        ({"roles": {"r": RoleSpec(name="r", concurrency=10, rate=RATE)}}, {}, "role:r"),
        ({"workers": {"command": WorkerSpec(name="command", rate=RATE)}}, {}, "worker:command"),
        (
            {"providers": {"anthropic": ProviderSpec(name="anthropic", rate=RATE)}},
            {"provider": "anthropic"},
            "provider:anthropic",
        ),
        # with no provider named, the worker kind is the provider
        (
            {"providers": {"command": ProviderSpec(name="command", rate=RATE)}},
            {},
            "provider:command",
        ),
    ],
)
def test_rate_limit_refuses_with_retry_after_and_refills(
    changes: dict[str, Any], options: dict[str, str], bucket: str
) -> None:
    core, events, _ = make_core(settings(**changes))
    now = 1000.0
    opts = JobOptions.from_json(options)
    first = granted(core, job(id="j1", role="r", options=opts), now)
    assert first.granted["rate_tokens"] == f"{bucket}=1"
    granted(core, job(id="j2", role="r", options=opts), now)
    r = refused(core, job(id="j3", role="r", options=opts), now)
    assert r.reason == RATE_LIMIT and r.retry_after_s == pytest.approx(2.0) and bucket in r.message
    assert refused(
        core, job(id="j3", role="r", options=opts), now + 1.5
    ).retry_after_s == pytest.approx(0.5)
    granted(core, job(id="j3", role="r", options=opts), now + 2.0)
    assert events[-1].data["retry_after_s"] == pytest.approx(0.5)
    # another role / kind / provider is not limited by this bucket
    other = job(id="x", role="solo", worker="codex", options=JobOptions(provider="other"))
    assert granted(core, other, now).granted.get("rate_tokens") is None


def test_a_refused_request_takes_no_token() -> None:
    s = settings(roles={"r": RoleSpec(name="r", concurrency=1, rate=RATE)})
    core, _, _ = make_core(s)
    granted(core, job(id="j1", role="r"))
    for _ in range(5):  # refused by the concurrency cap: the bucket must not drain
        assert refused(core, job(id="j2", role="r")).reason == BUDGET_EXHAUSTED
    assert core.rates.buckets["role:r"].level(1000.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("period", "now", "bounds"),
    [
        (CostPeriod.DAILY, ts(2024, 3, 10, 12), (ts(2024, 3, 10), ts(2024, 3, 11))),
        (CostPeriod.MONTHLY, ts(2024, 2, 29, 23), (ts(2024, 2, 1), ts(2024, 3, 1))),
        (CostPeriod.MONTHLY, ts(2024, 12, 31, 5), (ts(2024, 12, 1), ts(2025, 1, 1))),
        (CostPeriod.ROLLING_30D, ts(2024, 3, 31), (ts(2024, 3, 1), ts(2024, 3, 31))),
    ],
)
def test_period_bounds(period: CostPeriod, now: float, bounds: tuple[float, float]) -> None:
    assert period_bounds(period, now) == bounds


def cost_core(period: CostPeriod, allowance: float = 1.0) -> Any:
    s = settings(tenants={"t": TenantSpec(name="t", cost_allowance_usd=allowance, period=period)})
    return make_core(s)[0]


@pytest.mark.parametrize(
    ("period", "spent_at", "refused_at", "retry_after", "free_at"),
    [
        (CostPeriod.DAILY, ts(2024, 3, 10, 9), ts(2024, 3, 10, 12), 12 * 3600.0, ts(2024, 3, 11)),
        (CostPeriod.MONTHLY, ts(2024, 3, 2), ts(2024, 3, 31, 23), 3600.0, ts(2024, 4, 1)),
        # rolling: the hour 12:00-13:00 of March 1 counts until 13:00 thirty days later
        (
            CostPeriod.ROLLING_30D,
            ts(2024, 3, 1, 12, 30),
            ts(2024, 3, 31),
            13 * 3600.0,
            ts(2024, 3, 31, 13),
        ),
    ],
)
def test_cost_allowance_per_tenant_and_period(
    period: CostPeriod, spent_at: float, refused_at: float, retry_after: float, free_at: float
) -> None:
    core = cost_core(period)
    p = run(core, job(id="j1"), failed(cost=0.6), spent_at)
    assert p.granted["allowance_usd"] == "1"
    assert granted(core, job(id="j2"), spent_at).granted["allowance_usd"] == "0.4"
    [p2] = core.gate.live_permits()
    core.complete(p2, job(id="j2"), replace(ok(), cost_usd=0.5), spent_at)
    r = refused(core, job(id="j3"), refused_at)
    assert r.reason == BUDGET_EXHAUSTED and "allowance" in r.message
    assert r.retry_after_s == pytest.approx(retry_after)
    assert refused(core, job(id="j3"), free_at - 1).reason == BUDGET_EXHAUSTED
    assert granted(core, job(id="j3"), free_at).granted["allowance_usd"] == "1"


def test_cost_is_per_tenant_and_unpriced_results_cost_nothing() -> None:
    core = cost_core(CostPeriod.DAILY)
    now = ts(2024, 3, 10, 9)
    run(core, job(id="j1"), failed(cost=5.0), now)
    run(core, job(id="o1", tenant="other"), failed(cost=50.0), now)  # no allowance: never refused
    granted(core, job(id="o2", tenant="other"), now)
    assert refused(core, job(id="j2"), now).reason == BUDGET_EXHAUSTED
    ledger = CostLedger({})
    assert ledger.spent("t", now) == 0.0 and ledger.remaining("t", now) is None


def test_budget_config() -> None:
    text = """
roles: {r: {rate: {per_s: 2, burst: 4}}}
workers: {codex: {max_inflight: 3, rate: {per_s: 0.5}}}
providers: {openai: {rate: {per_s: 10, burst: 20}}}
tenants: {acme: {max_inflight: 8, cost_allowance_usd: 25.5, period: rolling_30d}}
"""
    s = resolve(parse(text, "c.yaml"), "c.yaml")
    assert s.roles["r"].rate == RateSpec(per_s=2, burst=4)
    assert s.workers["codex"] == WorkerSpec(
        name="codex", max_inflight=3, rate=RateSpec(per_s=0.5, burst=1)
    )
    assert s.providers["openai"].rate == RateSpec(per_s=10, burst=20)
    assert s.tenants["acme"] == TenantSpec(
        name="acme", max_inflight=8, cost_allowance_usd=25.5, period=CostPeriod.ROLLING_30D
    )
    with pytest.raises(ConfigError, match=r"tenants\.acme\.period"):
        parse("tenants: {acme: {period: weekly}}", "c.yaml")
    with pytest.raises(ConfigError, match=r"workers\.codex\.rate\.per_s"):
        parse("workers: {codex: {rate: {per_s: 0}}}", "c.yaml")
