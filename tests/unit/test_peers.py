"""runtime/peers.py and the control socket's capabilities: who may use the engine's sockets,
and what one of its jobs may ask."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.runtime.control import job_may, serve_control, tell
from corral.runtime.peers import Peer, Refused, check_user, credentials, identify, restrict


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


def test_a_caller_gone_before_it_is_identified_is_refused_not_taken_for_the_operator() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its /proc entry, and every mark on it, are gone

    async def no_job(job: str) -> bool:
        return False

    with pytest.raises(Refused, match=f"pid {gone.pid} exited before it could be identified"):
        anyio.run(identify, Peer(gone.pid, os.geteuid(), os.getegid()), no_job)
    me = Peer(os.getpid(), os.geteuid(), os.getegid())
    assert anyio.run(identify, me, no_job) == me  # a live caller without a job's mark


def test_a_told_engine_wakes_without_answering_and_looks_up_only_whom_it_must(
    tmp_path: Path,
) -> None:
    """`tell` does not wait for the answer; the engine still acts on it. Who the caller is
    (its ancestors' /proc entries) is looked up only for an operation whose answer depends on
    it, here `whoami`, and not for the pokes every submission sends."""
    seen: list[tuple[str, str]] = []
    looked_up: list[str] = []

    told = anyio.Event()

    async def handle(request: dict[str, Any], peer: Peer) -> dict[str, Any]:
        seen.append((request["op"], peer.capability))
        told.set()
        return {"ok": True, "capability": peer.capability}

    async def is_job(job: str) -> bool:
        looked_up.append(job)
        return job == "J-1"

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(partial(serve_control, tmp_path, handle, is_job=is_job))
            with anyio.fail_after(10):
                assert await anyio.to_thread.run_sync(tell, tmp_path, "submitted")
                await told.wait()  # acted on, though nobody waited for the answer
                # a process of job J-1 (its environment names it) pokes, then asks who it is
                script = (
                    "import sys; from pathlib import Path; "
                    "from corral.runtime.control import poke, tell; "
                    "d = Path(sys.argv[1]); assert tell(d, 'wake'); "
                    "print(poke(d, 'whoami')['capability'])"
                )
                out = await anyio.run_process(
                    [sys.executable, "-c", script, str(tmp_path)],
                    env={**os.environ, "CORRAL_JOB_ID": "J-1"},
                )
            assert out.stdout.decode().strip() == "job"
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert seen == [("submitted", "operator"), ("wake", "operator"), ("whoami", "job")]
    assert looked_up == ["J-1"]  # once: for whoami
    assert not tell(tmp_path / "nowhere", "wake")  # no engine: nothing took it
