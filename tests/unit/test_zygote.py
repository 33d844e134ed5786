"""The shims' zygote (workers/zygote.py, shim.c --zygote), with real processes: what it forks
is a shim like an exec'd one (tests/unit/test_shim.py runs every shim test both ways); here,
what is its own: its faults, what it refuses, what it carries."""

from __future__ import annotations

import array
import os
import signal
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.workers import zygote as zygote_mod
from corral.workers.process import ShimProcess, ShimResult, spawn
from corral.workers.proctab import alive, read_stat
from corral.workers.zygote import Zygote, ZygoteLost
from tests.helpers import eventually

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


def wait(proc: ShimProcess, timeout: float = 10.0) -> ShimResult:
    async def main() -> ShimResult:
        with anyio.fail_after(timeout):
            return await proc.wait()

    return anyio.run(main)


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def start(z: Zygote | None, d: Path, *argv: str, **kw: Any) -> ShimProcess:
    kw.setdefault("env", ENV)
    return spawn(
        attempt_dir=d, argv=argv, cwd=None, grace_s=5.0, deadline_epoch_s=None, via=z, **kw
    )


def test_the_zygote_forks_the_shim_and_reaps_it(zygote: Zygote, tmp_path: Path) -> None:
    proc = start(zygote, tmp_path / "a", "sh", "-c", "exit 3")
    assert not proc.is_child and zygote.pid is not None
    stat = read_stat(proc.pid)
    assert stat is None or stat.ppid == zygote.pid  # it may be over already
    result = wait(proc)
    assert (result.reason, result.exit_code) == ("exited", 3)
    eventually(lambda: read_stat(proc.pid) is None, what="the shim reaped by the zygote")


def test_a_killed_zygote_leaves_its_shim_running_and_is_replaced(
    zygote: Zygote, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    proc = start(zygote, tmp_path / "a", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done")
    try:
        first = zygote.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        eventually(lambda: not alive(first), what="the zygote dead")
        assert alive(proc.pid), "the shim is not the zygote's to stop"
        # The dead one is noticed when the request cannot be sent (a new one serves it) or,
        # when the kernel still had its socket open (seen once in CI: the request left and the
        # answer was a reset), as a lost request: that attempt is exec'd, the next one has a
        # new zygote.
        other = start(zygote, tmp_path / "b", "true")
        assert wait(other).exit_code == 0
        if zygote.pid is None:
            other = start(zygote, tmp_path / "c", "true")
            assert wait(other).exit_code == 0
        assert zygote.pid not in (None, first)
    finally:
        gate.touch()  # the shim and its job end, whatever failed above
    assert wait(proc).exit_code == 0


def test_a_reply_lost_after_the_fork_adopts_that_shim_and_starts_no_other(
    tmp_path: Path,
) -> None:
    """The zygote forked the shim, then went away before its answer reached us: the attempt
    directory says a shim holds it, and that shim is the attempt's; the job runs once."""

    class LosesReplies(Zygote):
        def spawn(self, *args: Any, **kw: Any) -> tuple[int, int | None] | None:
            forked = super().spawn(*args, **kw)
            assert forked is not None
            if forked[1] is not None:
                os.close(forked[1])
            raise ZygoteLost("the answer was lost")

    z = LosesReplies()
    try:
        runs = tmp_path / "runs"
        proc = start(z, tmp_path / "a", "sh", "-c", f"echo run >> {runs}; sleep 0.3; exit 4")
        assert wait(proc).exit_code == 4
        assert runs.read_text() == "run\n"
    finally:
        z.close()


def test_a_request_the_zygote_never_read_is_execd_instead(tmp_path: Path) -> None:
    """The zygote is stopped: the request waits its bound, the zygote is killed and, since no
    shim took the attempt directory, the shim is exec'd here; the job runs once."""
    z = Zygote(reply_s=0.3)
    try:
        assert wait(start(z, tmp_path / "warm", "true")).exit_code == 0
        stopped = z.pid
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        runs = tmp_path / "runs"
        proc = start(z, tmp_path / "a", "sh", "-c", f"echo run >> {runs}")
        assert proc.is_child, "exec'd here"
        assert wait(proc).exit_code == 0 and runs.read_text() == "run\n"
        assert read_stat(stopped) is None and z.pid is None  # killed and reaped
    finally:
        z.close()


def test_a_request_too_big_for_it_is_execd(zygote: Zygote, tmp_path: Path) -> None:
    big = {f"BIG{i}": "x" * 60_000 for i in range(4)}  # each under the kernel's bound of one
    assert sum(map(len, big.values())) > zygote_mod.MAX_REQUEST
    proc = start(zygote, tmp_path / "a", "sh", "-c", 'test "${#BIG3}" -eq 60000', env=ENV | big)
    assert proc.is_child
    assert wait(proc).exit_code == 0


def test_without_a_zygote_shims_are_execd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class NoBinary:
        @staticmethod
        def shim_path() -> Path:
            return tmp_path / "no-such-zygote"

    monkeypatch.setattr(zygote_mod, "native", NoBinary)
    z = Zygote()
    proc = start(z, tmp_path / "a", "true")
    assert proc.is_child and z.pid is None
    assert wait(proc).exit_code == 0
    assert "cannot start the shims' zygote" in caplog.text
    again = start(z, tmp_path / "b", "true")  # not tried again at every attempt
    assert wait(again).exit_code == 0 and caplog.text.count("cannot start") == 1


def test_the_zygote_carries_nothing_of_the_engines_environment(
    zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_CANARY", "zygote-canary-1f3a")
    gate = tmp_path / "gate"
    proc = start(zygote, tmp_path / "a", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done")
    try:
        assert zygote.pid is not None
        for pid in (zygote.pid, proc.pid):  # what `ps e` and /proc show of either
            assert b"zygote-canary" not in Path(f"/proc/{pid}/environ").read_bytes()
    finally:
        gate.touch()
    assert wait(proc).exit_code == 0


def test_close_stops_the_zygote_and_its_shims_run_on(tmp_path: Path) -> None:
    z = Zygote()
    gate = tmp_path / "gate"
    proc = start(z, tmp_path / "a", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done")
    pid = z.pid
    assert pid is not None
    z.close()
    assert z.pid is None and read_stat(pid) is None  # exited at the EOF, reaped
    assert alive(proc.pid)
    gate.touch()
    assert wait(proc).exit_code == 0


@pytest.mark.parametrize(
    ("body", "nfds"),
    [
        (b"", 3),  # no header
        (struct.pack("II", 0, 0), 3),  # no argv
        (struct.pack("II", 2, 0) + b"only-one\0", 3),  # fewer strings than counted
        (struct.pack("II", 1, 0) + b"unterminated", 3),
        (struct.pack("II", 1, 0) + b"true\0", 2),  # too few descriptors
        (struct.pack("II", 0xFFFFFFFF, 0xFFFFFFFF) + b"x\0", 3),
    ],
)
def test_a_malformed_request_is_refused_and_the_zygote_serves_on(
    zygote: Zygote, tmp_path: Path, body: bytes, nfds: int
) -> None:
    assert wait(start(zygote, tmp_path / "warm", "true")).exit_code == 0
    sock = zygote._sock
    assert sock is not None
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(nfds)]
    try:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sock.sendmsg([body or b"\0"], rights)
    finally:
        for fd in fds:
            os.close(fd)
    reply, _anc, _flags, _ = sock.recvmsg(8, socket.CMSG_SPACE(4))
    assert struct.unpack("ii", reply) == (-1, 22)  # EINVAL, nothing forked
    assert wait(start(zygote, tmp_path / "after", "true")).exit_code == 0
