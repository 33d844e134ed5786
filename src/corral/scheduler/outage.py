"""A store that stops answering is an outage to ride out, not a reason to stop the engine.

A locked SQLite file, a full disk or a PostgreSQL connection the server terminated makes one
write fail; the attempts keep running in their own sessions. Every engine loop that writes goes
through `StoreHealth.retry`: the write is tried again with capped exponential backoff (with
jitter) until the store answers, the degraded state is logged once when the outage starts and
once when it ends, and `snapshot()` reports it (`corral status`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from corral.domain.errors import StoreError

log = logging.getLogger("corral.store")

T = TypeVar("T")

BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 5.0


class StoreHealth:
    """Whether the store answers. An outage lasts while any caller's store call keeps failing
    (one kind of write may fail while a small one still passes: that is not the end of it); it
    is logged once when it begins and once when it ends."""

    def __init__(
        self, *, clock: Callable[[], float] = time.time, jitter: Callable[[], float] = random.random
    ) -> None:
        self.clock = clock
        self.jitter = jitter
        self.since: float | None = None  # when the current outage began
        self.error = ""
        self.failures = 0  # failed tries in the current outage
        self.outages = 0  # outages since the engine started
        self._failing: dict[str, int] = {}  # what keeps failing → its failed tries in a row

    @property
    def degraded(self) -> bool:
        return self.since is not None

    def failed(self, what: str, err: BaseException) -> float:
        """One failed store call; returns how long to wait before the next try. An error that
        waiting cannot mend (a damaged database) is raised again: the engine stops on it."""
        if isinstance(err, StoreError) and not err.recoverable:
            log.error("store unusable (%s: %s): stopping", what, err)
            raise err
        self.error = str(err)
        self.failures += 1
        tries = self._failing[what] = self._failing.get(what, 0) + 1
        if self.since is None:
            self.since = self.clock()
            self.outages += 1
            log.error(
                "store unavailable (%s: %s): running attempts keep running; writes are "
                "retried until it answers",
                what,
                err,
            )
        delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * float(2 ** min(tries - 1, 10)))
        return delay * (0.5 + self.jitter() / 2)

    def answered(self, what: str) -> None:
        """The store call `what` succeeded: the outage ends once nothing fails any more."""
        if self._failing.pop(what, None) is None or self._failing or self.since is None:
            return
        log.warning(
            "store answers again after %.1f s and %d failed tries: writes resumed",
            self.clock() - self.since,
            self.failures,
        )
        self.since = None
        self.error = ""
        self.failures = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "degraded": self.degraded,
            "since": self.since,
            "error": self.error or None,
            "failed_tries": self.failures,
            "outages": self.outages,
        }

    async def retry(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` until it does not fail with a StoreError, waiting with backoff between."""
        while True:
            try:
                result = await call()
            except StoreError as err:
                await anyio.sleep(self.failed(what, err))
                continue
            self.answered(what)
            return result
