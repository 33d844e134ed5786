"""A token bucket per API token (corral.yaml `api.rate_limit`), so that one client cannot starve
the others: each request takes one unit; units refill at `per_s` up to `burst`. Over it the
request is refused with 429 and Retry-After (the time until one unit is back)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from corral.domain.errors import Backpressure


class RateLimited(Backpressure):
    """A token made more requests than its bucket allows."""

    code = "rate_limited"


@dataclass(slots=True)
class _Bucket:
    units: float
    at: float


class Buckets:
    """The buckets of every token seen, in this process (each engine keeps its own)."""

    def __init__(
        self,
        per_s: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        self.per_s, self.burst, self.clock, self.max_keys = per_s, burst, clock, max_keys
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> None:
        """Take one unit of `key`'s bucket, or raise RateLimited."""
        now = self.clock()
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) >= self.max_keys:  # bounded memory: forget the full ones
                self._buckets = {
                    k: v
                    for k, v in self._buckets.items()
                    if v.units + (now - v.at) * self.per_s < self.burst
                }
            b = self._buckets[key] = _Bucket(float(self.burst), now)
        b.units = min(float(self.burst), b.units + (now - b.at) * self.per_s)
        b.at = now
        if b.units < 1:
            wait = (1 - b.units) / self.per_s
            raise RateLimited(
                f"rate limit: at most {self.per_s:g} requests per second "
                f"(bursts of {self.burst}) per token; retry in {wait:.1f}s",
                wait,
            )
        b.units -= 1
