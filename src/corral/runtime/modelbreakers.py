"""Circuit breakers of the model gateway, per provider and per model, fed by what providers answer.

Every upstream call the gateway makes is a result for two breakers: `provider:<upstream host>`
and `model:<model>`. A 5xx or no answer at all (the connection refused or dropped, no status line
within 300 s) is a failure of both; a 429 (a rate limit, which providers set per model) a failure
of the model's alone; any other answer a success (a 4xx other than 429 says nothing about the
provider's health: it counts as neither). They open, stay open and probe like the
core's breakers (core/breakers.py, same `breakers:` settings): OPEN after `consecutive_failures`
failures in a row, or a `failure_rate` over the last `window_s` once there are `min_calls`;
`open_s` later one call goes through as a probe (HALF_OPEN) and its result closes or re-opens
the breaker. A worker's `gateway.breakers` sets these figures for its provider and models
instead of the top-level `breakers` (which the core's worker breakers keep).

While a model's breaker is open the gateway sends the call to the first of the role's
`fallback_models` whose breaker is closed (the request's `model` rewritten), and refuses it
(529 for Anthropic, 503 for OpenAI, without calling the provider) when there is none or when the
provider's own breaker is open. A fallback to another provider is the core's business: the
role's `fallback_workers` take over while its worker kind's breaker is open.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from corral.core.breakers import CLOSED, HALF_OPEN, OPEN, Breaker
from corral.domain.settings import BreakerSpec

GATEWAY = "gateway"  # the `probe` of a HALF_OPEN breaker while its probe call is in flight


class ModelBreakers:
    def __init__(self, spec: BreakerSpec) -> None:
        self.spec = spec
        self.breakers: dict[str, Breaker] = {}

    def get(self, name: str, spec: BreakerSpec | None = None) -> Breaker:
        b = self.breakers.get(name)
        if b is None:
            b = self.breakers[name] = Breaker(
                name=name, spec=spec or self.spec, history=deque(maxlen=20)
            )
        elif spec is not None and spec != b.spec:
            b.spec = spec  # the configuration changed
        return b

    def open_one(self, names: Iterable[str], now: float) -> Breaker | None:
        """The first of these breakers that refuses a call now; None: all admit it. A breaker
        whose `open_s` is over admits one call, its probe."""
        for name in names:
            b = self.breakers.get(name)
            if b is None or b.state == CLOSED:
                continue
            if b.state == OPEN and now >= (b.opened_at or 0) + b.spec.open_s:
                self._move(b, HALF_OPEN, now, b.reason)
            if b.state == HALF_OPEN and b.probe is None:
                continue  # this call may be the probe
            return b
        return None

    def admitted(self, names: Iterable[str]) -> None:
        """A call goes upstream: it is the probe of every HALF_OPEN breaker it answers to."""
        for name in names:
            b = self.breakers.get(name)
            if b is not None and b.state == HALF_OPEN and b.probe is None:
                b.probe = GATEWAY

    def record(
        self, names: Iterable[str], failed: bool | None, now: float, spec: BreakerSpec | None = None
    ) -> None:
        """One upstream call's result (None: neither a success nor a failure)."""
        for name in names:
            b = self.get(name, spec)
            if failed is not None:
                b.calls.append((now, failed))
                b.consecutive = b.consecutive + 1 if failed else 0
            if b.state == HALF_OPEN and b.probe is not None:
                b.probe = None
                if failed:
                    self._move(b, OPEN, now, "probe_failed")
                else:
                    b.calls.clear()
                    b.consecutive = 0
                    self._move(b, CLOSED, now, "probe_succeeded")
            elif b.state == CLOSED and failed and (why := b.trip_reason(now)) is not None:
                self._move(b, OPEN, now, why)

    def _move(self, b: Breaker, state: str, now: float, reason: str | None) -> None:
        b.history.append({"at": now, "from": b.state, "to": state, "reason": reason})
        b.state, b.reason = state, reason
        if state == OPEN:
            b.opened_at = now
        elif state == CLOSED:
            b.opened_at = None

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        return [
            {
                "name": b.name,
                "scope": GATEWAY,
                "state": b.state,
                "opened_at": b.opened_at,
                "reason": b.reason,
                "probe": b.probe,
                "retry_after_s": b.retry_after(now),
                **b.figures(now),
                "history": list(b.history),
            }
            for b in sorted(self.breakers.values(), key=lambda x: x.name)
        ]


def failed(status: int | None) -> bool | None:
    """What an upstream answer says of the provider's health (None: nothing)."""
    if status is None or status == 429 or status >= 500:
        return True
    return False if status < 400 else None
