"""runtime/peers.py and the control socket's capabilities: who may use the engine's sockets,
and what one of its jobs may ask."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from corral.runtime.control import job_may
from corral.runtime.peers import Refused, check_user, credentials, restrict


@pytest.mark.parametrize(
    ("request_", "allowed"),
    [
        ({"op": "ping"}, True),
        ({"op": "wake"}, True),
        ({"op": "submitted"}, True),
        ({"op": "whoami"}, True),
        ({"op": "core", "core_op": "snapshot"}, True),
        ({"op": "core", "core_op": "reset_breaker", "name": "worker:command"}, False),
        ({"op": "core", "core_op": "clear_escalation", "escalation": "e"}, False),
        ({"op": "core", "core_op": "restore", "state": {}}, False),
        ({"op": "core", "core_op": "report_metric"}, False),
        ({"op": "shutdown"}, False),
        ({}, False),
    ],
)
def test_a_job_may_only_use_the_jobs_operations(request_: dict[str, Any], allowed: bool) -> None:
    assert job_may(request_) is allowed


def test_only_the_engines_user_or_its_group_is_admitted() -> None:
    me = os.geteuid()
    check_user(1, me, 0, group=None)
    with pytest.raises(Refused, match=f"pid 42 runs as uid 65534: only uid {me} may use"):
        check_user(42, 65534, 65534, group=None)
    check_user(42, 65534, 65534, group=65534)  # its primary group is the socket group
    with pytest.raises(Refused, match="or group 7"):
        check_user(999_999_999, 65534, 65534, group=7)  # no such process: no other groups


def test_credentials_are_the_kernels(tmp_path: Path) -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert credentials(a) == (os.getpid(), os.geteuid(), os.getegid())


def test_a_socket_file_is_private_or_shared_with_its_group(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        path.chmod(0o777)
        restrict(path, None)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        restrict(path, 65534)
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, 65534)
