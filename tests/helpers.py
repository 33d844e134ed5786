"""Shared test helpers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T | None], *, timeout: float = 15.0, what: str = "") -> T:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds.

    For conditions in other processes (a pid file written by a job, a process gone) that no
    event reaches us for; the condition is waited on, never a fixed delay. A check that is
    itself slow (a `corral` command) is not run back to back: the pause between two runs is at
    least as long as the run, so polling takes at most half a core from the processes under test.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    delay = 0.005
    while True:
        started = time.monotonic()
        value = check()
        if value:
            return value
        took = time.monotonic() - started
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        pause.wait(max(delay, took))
        delay = min(delay * 2, 0.1)
