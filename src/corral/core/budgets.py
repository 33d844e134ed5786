"""Rate and cost budgets checked at permit time.

Rate limits are token buckets per role, per worker kind and per provider (the job's
`options["provider"]`, else its worker kind): a permit takes one token from each bucket that
applies, and a request finding one empty is refused with the time until it holds a token again.
Cost allowances are per tenant and period; the cost of an attempt is known when it ends
(`AttemptResult.cost_usd`), so attempts already running may overshoot the allowance once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral.domain.models import Job
from corral.domain.settings import CostPeriod, RateSpec, Settings, TenantSpec

DAY_S = 86_400.0
HOUR_S = 3_600.0
ROLLING_S = 30 * DAY_S
KEEP_S = 32 * DAY_S  # longer than any period


@dataclass(slots=True)
class TokenBucket:
    """`per_s` tokens a second up to `burst`; starts full. Pure arithmetic on the given `now`."""

    per_s: float
    burst: int
    tokens: float = -1.0  # -1: never used, i.e. full
    at: float = 0.0

    def level(self, now: float) -> float:
        if self.tokens < 0:
            return float(self.burst)
        return min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.per_s)

    def wait_s(self, now: float) -> float:
        """Seconds until one token is available (0: now)."""
        missing = 1.0 - self.level(now)
        if missing <= 0:
            return 0.0
        return missing / self.per_s if self.per_s > 0 else float("inf")

    def take(self, now: float) -> float:
        """Take one token (the caller checked `wait_s`); the tokens left."""
        self.tokens = self.level(now) - 1.0
        self.at = now
        return self.tokens


def provider_of(job: Job, kind: str) -> str:
    return job.options.provider or kind


class RateLimits:
    """The token buckets of every role, worker kind and provider that has a `rate`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.buckets: dict[str, TokenBucket] = {}

    def _specs(self, job: Job, kind: str) -> list[tuple[str, RateSpec]]:
        s = self.settings
        role, worker = s.roles.get(job.role), s.workers.get(kind)
        provider = s.providers.get(provider_of(job, kind))
        found = [
            (f"role:{job.role}", role.rate if role else None),
            (f"worker:{kind}", worker.rate if worker else None),
            (f"provider:{provider_of(job, kind)}", provider.rate if provider else None),
        ]
        return [(name, spec) for name, spec in found if spec is not None]

    def _bucket(self, name: str, spec: RateSpec) -> TokenBucket:
        b = self.buckets.get(name)
        if b is None:
            b = self.buckets[name] = TokenBucket(per_s=spec.per_s, burst=spec.burst)
        return b

    def check(self, job: Job, kind: str, now: float) -> tuple[float, list[str]]:
        """(seconds to wait, empty buckets); (0, []) when every bucket has a token."""
        waits = [(self._bucket(n, spec).wait_s(now), n) for n, spec in self._specs(job, kind)]
        empty = [(w, n) for w, n in waits if w > 0]
        return (max(w for w, _ in empty) if empty else 0.0), [n for _, n in empty]

    def take(self, job: Job, kind: str, now: float) -> dict[str, float]:
        """Take a token from each bucket that applies; the tokens left in each."""
        return {n: round(self._bucket(n, spec).take(now), 3) for n, spec in self._specs(job, kind)}

    def snapshot(self, now: float) -> dict[str, dict[str, float]]:
        return {
            n: {"tokens": round(b.level(now), 3), "burst": b.burst, "per_s": b.per_s}
            for n, b in sorted(self.buckets.items())
        }


def period_bounds(period: CostPeriod, now: float) -> tuple[float, float]:
    """[start, end) of the calendar period (UTC) containing `now`; rolling: the last 30 days."""
    if period is CostPeriod.DAILY:
        start = (now // DAY_S) * DAY_S
        return start, start + DAY_S
    if period is CostPeriod.MONTHLY:
        d = datetime.fromtimestamp(now, UTC)
        first = d.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = first.replace(year=d.year + d.month // 12, month=d.month % 12 + 1)
        return first.timestamp(), nxt.timestamp()
    return now - ROLLING_S, now


class CostLedger:
    """Cost spent per tenant, in hourly buckets (UTC days and months begin on an hour)."""

    def __init__(self, tenants: Mapping[str, TenantSpec]) -> None:
        self.tenants = tenants
        self.hours: dict[str, dict[float, float]] = {}

    def add(self, tenant: str, usd: float, at: float) -> None:
        hours = self.hours.setdefault(tenant, {})
        hour = (at // HOUR_S) * HOUR_S
        hours[hour] = hours.get(hour, 0.0) + usd
        for h in [h for h in hours if h < at - KEEP_S]:
            del hours[h]

    def _counted(self, tenant: str, now: float) -> list[tuple[float, float]]:
        """(hour, usd) entries inside the tenant's current period, oldest first."""
        spec = self.tenants.get(tenant)
        period = spec.period if spec else CostPeriod.MONTHLY
        start, _ = period_bounds(period, now)
        hours = sorted(self.hours.get(tenant, {}).items())
        if period is CostPeriod.ROLLING_30D:  # an hour partly inside the window counts whole
            return [(h, usd) for h, usd in hours if h + HOUR_S > start and h <= now]
        return [(h, usd) for h, usd in hours if start <= h <= now]

    def spent(self, tenant: str, now: float) -> float:
        return sum(usd for _, usd in self._counted(tenant, now))

    def remaining(self, tenant: str, now: float) -> float | None:
        """Allowance left this period (None: the tenant has no allowance)."""
        spec = self.tenants.get(tenant)
        if spec is None or spec.cost_allowance_usd is None:
            return None
        return spec.cost_allowance_usd - self.spent(tenant, now)

    def retry_after(self, tenant: str, now: float) -> float:
        """Seconds until the tenant is under its allowance again, if nothing else is spent."""
        spec = self.tenants[tenant]
        if spec.period is not CostPeriod.ROLLING_30D:
            return period_bounds(spec.period, now)[1] - now
        allowance = spec.cost_allowance_usd or 0.0
        left = self.spent(tenant, now)
        for hour, usd in self._counted(tenant, now):
            left -= usd
            if left < allowance:
                return max(0.0, hour + HOUR_S + ROLLING_S - now)
        return 0.0

    def snapshot(self, now: float) -> dict[str, dict[str, Any]]:
        names = set(self.hours) | {n for n, t in self.tenants.items() if t.cost_allowance_usd}
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            spec = self.tenants.get(name)
            out[name] = {
                "spent_usd": round(self.spent(name, now), 6),
                "allowance_usd": spec.cost_allowance_usd if spec else None,
                "period": (spec.period if spec else CostPeriod.MONTHLY).value,
            }
        return out

    def export(self) -> list[tuple[str, float, float]]:
        return [
            (t, h, usd)
            for t, hours in sorted(self.hours.items())
            for h, usd in sorted(hours.items())
        ]

    def restore(self, entries: Iterable[tuple[str, float, float]]) -> None:
        for tenant, hour, usd in entries:
            self.add(tenant, usd, hour)
