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
    event reaches us for; the condition is waited on, never a fixed delay.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    delay = 0.005
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        pause.wait(delay)
        delay = min(delay * 2, 0.1)
