"""Shared test helpers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
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


def ask_socket(path: Path, request: bytes) -> bytes:
    """Send `request` to the unix socket at `path`, close the writing side and return all it
    answered (the engine's and the governance socket's one-request protocol)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer
