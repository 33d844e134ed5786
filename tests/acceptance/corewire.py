"""`corral core` driven over its stdio as another scheduler would
(docs/reference/core-protocol.md)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import Any

from tests.acceptance.conftest import CORRAL, Corral


class CoreProcess:
    """One `corral core` child: send requests, read what it says."""

    def __init__(self, c: Corral) -> None:
        self.proc = subprocess.Popen(
            [CORRAL, "core"],
            env=c.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.buf = b""
        self.seen: list[dict[str, Any]] = []  # messages read past while looking for another
        self._ids = 100

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, msg: dict[str, Any]) -> None:
        self.send_raw(json.dumps(msg).encode() + b"\n")

    def recv(self, timeout: float = 30) -> dict[str, Any]:  # a guard against a hang
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "the core did not answer"
            chunk = os.read(fd, 65536)
            assert chunk, "the core closed stdout"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def until(self, match: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        """The next message that matches; the others are kept in `seen`."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.0, deadline - time.monotonic()))
            if match(msg):
                return msg
            self.seen.append(msg)

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send a request with a fresh id; its reply (events on the way are kept in `seen`)."""
        self._ids += 1
        rid = self._ids
        self.send({**msg, "id": rid})
        return self.until(lambda m: m.get("id") == rid and m["type"] != "event")

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=10)


def job(job_id: str, cwd: str, command: list[str], **limits: Any) -> dict[str, Any]:
    """A Job as the protocol carries it (role `default`, worker `command`)."""
    return {
        "id": job_id,
        "state": "QUEUED",
        "role": limits.pop("role", "default"),
        "worker": "command",
        "env_name": "local",
        "priority": 2,
        "tenant": "t",
        "command": command,
        "cwd": cwd,
        "env": {},
        "options": {},
        "limits": {"max_attempts": 1, "timeout_s": 30, "grace_s": 1, **limits},
        "created_at": 1.0,
        "updated_at": 1.0,
        "sort_at": 1.0,
    }


def attempt(
    job_id: str, permit: dict[str, Any], attempt_dir: str, index: int | None = None
) -> dict[str, Any]:
    """The Attempt a scheduler records for a permit (its index unless told otherwise)."""
    return {
        "id": f"a-{job_id}-{index or permit['attempt_index']}",
        "job_id": job_id,
        "index": permit["attempt_index"] if index is None else index,
        "state": "STARTING",
        "permit_id": permit["id"],
        "deadline_at": permit["deadline_at"],
        "created_at": 1.0,
        "dir": attempt_dir,
        "engine_id": "foreign",
    }
