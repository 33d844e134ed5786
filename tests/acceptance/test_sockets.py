"""The engine's sockets: only its user may use them (SO_PEERCRED, whatever the file modes say),
and a job the engine runs may not run operator commands through them (runtime/peers.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from corral.runtime.control import socket_path
from corral.workers.agents.base import governance_socket
from tests.acceptance.conftest import CORRAL, Corral
from tests.helpers import ask_socket

NOBODY = 65534


def _as_nobody(path: Path, request: bytes) -> str:
    """Connect to `path` from a forked child running as uid/gid 65534, send `request`, and
    return what it read, or `error: <errno name>` when it could not connect."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                answer = ask_socket(path, request)
            except OSError as err:
                answer = f"error: {type(err).__name__}".encode()
            os.write(write_end, answer)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return out.decode(errors="replace")


def test_a_peer_of_another_user_is_refused_even_through_an_open_socket(tmp_path: Path) -> None:
    # A data directory whose socket paths are too long for AF_UNIX: both sockets live in /tmp,
    # where another user could reach them if their modes let it.
    c = Corral(tmp_path / ("long-path-" * 8))
    try:
        c.serve()
        control, governance = socket_path(c.data), governance_socket(c.data)
        assert str(control).startswith("/tmp/") and str(governance).startswith("/tmp/")
        for path in (control, governance):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert _as_nobody(path, b'{"op": "ping"}\n') == "error: PermissionError"

        # A socket left open to everyone (the mode is no longer the only wall): still refused.
        control.chmod(0o666)
        governance.chmod(0o666)
        answer = json.loads(
            _as_nobody(
                control, b'{"op": "core", "core_op": "reset_breaker", "name": "worker:command"}\n'
            )
        )
        assert answer["ok"] is False and "refused" in answer["error"]
        assert f"runs as uid {NOBODY}" in answer["error"]
        hook = _as_nobody(governance, b'{"attempt": "x.1", "token": "t"}\n{}')
        assert hook.startswith("2\ncorral: tool call denied: refused"), hook
        log = c.engine_log()
        assert "engine.sock: refused: pid" in log and f"runs as uid {NOBODY}" in log
        assert "governance.sock: refused" in log

        assert c.wait(c.submit("true")) == 0  # the engine keeps serving its own user
    finally:
        c.stop_all()


def test_a_job_cannot_run_operator_commands_the_operator_can(corral: Corral) -> None:
    corral.serve()
    script = (
        f"{CORRAL} status >/dev/null && echo status-ok; "
        f"{CORRAL} breakers reset worker:command; echo rc=$?; "
        f"env -u CORRAL_JOB_ID {CORRAL} breakers reset worker:command; echo rc=$?"
    )
    job = corral.submit("sh", "-c", script)
    assert corral.wait(job) == 0
    out = corral.ok("logs", job)
    err = corral.run("logs", job).stderr
    assert "status-ok" in out, (out, err)  # a job may read the core's state
    assert out.count("rc=10") == 2, (out, err)  # … but not reset a breaker, env or no env
    assert err.count("refused: 'reset_breaker' is an operator command") == 2, err
    assert f"job {job} may not run it" in err
    assert "engine.sock: refused 'reset_breaker'" in corral.engine_log()

    r = corral.run("breakers", "reset", "worker:command")  # the operator may
    assert r.returncode == 0, r.stderr
    assert "reset to CLOSED" in r.stdout


def test_a_member_of_the_socket_group_is_admitted(tmp_path: Path) -> None:
    c = Corral(tmp_path / ("long-path-" * 8))
    c.config.write_text(c.config.read_text() + "engine:\n  socket_group: nogroup\n")
    try:
        c.serve()
        control = socket_path(c.data)
        mode = control.stat()
        assert (stat.S_IMODE(mode.st_mode), mode.st_gid) == (0o660, NOBODY)
        answer = json.loads(_as_nobody(control, b'{"op": "ping"}\n'))  # gid 65534: nogroup
        assert answer["ok"] is True, answer
    finally:
        c.stop_all()


def test_a_job_may_cancel_its_children_but_no_operator_write(corral: Corral) -> None:
    corral.serve()
    other = corral.submit("sleep", "60")
    script = (
        f"child=$({CORRAL} submit -- sleep 60) && {CORRAL} cancel $child >/dev/null "
        "&& echo child-cancelled; "
        f"{CORRAL} cancel {other}; echo cancel-other=$?; "
        f"{CORRAL} kill-switch on --reason mine; echo kill=$?; "
        f"{CORRAL} pause --reason mine; echo pause=$?; "
        f"{CORRAL} budget set --scope role --target default --period daily --ceiling-usd 0; "
        "echo budget=$?"
    )
    job = corral.submit("sh", "-c", script)
    assert corral.wait(job) == 0
    out, err = corral.ok("logs", job), corral.run("logs", job).stderr
    assert "child-cancelled" in out, (out, err)
    for line in ("cancel-other=10", "kill=10", "pause=10", "budget=10"):
        assert line in out, (out, err)
    assert f"job {job} may cancel itself and the jobs it submitted, not job {other}" in err
    assert f"`corral kill-switch on` is an operator command; job {job} may not run it" in err
    assert corral.job(other)["state"] == "RUNNING"
    assert corral.json("kill-switch", "status") == []  # nothing was written

    corral.ok("cancel", other)  # the operator may
    assert corral.wait(other) == 130
