"""The core as a supervised child: the protocol on stdio, SIGKILL and SIGSTOP of the core,
and the restart budget."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from corral.runtime.control import poke
from corral.workers.proctab import alive
from tests.acceptance.conftest import CONFIG, Corral
from tests.acceptance.corewire import CoreProcess, attempt
from tests.acceptance.corewire import job as _job
from tests.helpers import eventually

FAST_CORE = (
    CONFIG
    + """\
core:
  heartbeat_s: 0.2
  heartbeat_timeout_s: 2.5
  max_restarts: 3
  restart_window_s: 60
"""
)


def test_the_core_speaks_json_lines_and_survives_bad_input(corral: Corral, tmp_path: Path) -> None:
    core = CoreProcess(corral)
    try:
        hello = core.recv()
        assert hello["type"] == "hello" and "command" in hello["workers"]
        core.send_raw(b"{not json\n")
        assert core.recv()["type"] == "error"
        core.send_raw(b"[1, 2]\n")
        assert "object" in core.recv()["error"]
        core.send({"type": "launch_missiles", "id": 7})
        reply = core.recv()
        assert reply == {
            "type": "error",
            "id": 7,
            "error": "unknown message type 'launch_missiles'",
        }
        core.send_raw(b'{"type": "heartbeat", "pad": "' + b"x" * (1 << 21) + b'"}\n')
        assert "exceeds the 1048576-byte limit" in core.recv()["error"]
        core.send({"type": "request_permit", "id": 8})  # missing fields
        assert core.recv()["id"] == 8
        core.send({"type": "heartbeat", "id": 9, "seq": 1})
        assert core.recv()["type"] == "heartbeat"

        job = _job("j-proto", str(tmp_path), ["sh", "-c", "exit 3"])
        core.send({"type": "request_permit", "id": 10, "job": job, "attempt": 1})
        granted = core.recv()
        assert granted["type"] == "permit" and granted["permit"]["job_id"] == "j-proto"
        attempt = {
            "id": "a1",
            "job_id": "j-proto",
            "index": 1,
            "state": "STARTING",
            "permit_id": granted["permit"]["id"],
            "deadline_at": granted["permit"]["deadline_at"],
            "created_at": 1.0,
            "dir": str(tmp_path / "attempt"),
            "engine_id": "test",
        }
        forged = {**granted["permit"], "deadline_at": granted["permit"]["deadline_at"] + 1e6}
        core.send(
            {"type": "submit_job", "id": 11, "job": job, "attempt": attempt, "permit": forged}
        )
        refused = core.recv()
        assert refused["type"] == "rejected" and refused["id"] == 11
        assert refused["reason"] == "PERMIT_FORGED" and "forged" in refused["message"]
        assert not (tmp_path / "attempt").exists()
        core.send(
            {
                "type": "submit_job",
                "id": 12,
                "job": job,
                "attempt": attempt,
                "permit": granted["permit"],
            }
        )
        started = core.recv()
        assert started["type"] == "job_started" and started["pid"] > 0
        done = core.recv()
        assert done["type"] == "job_completed" and done["result"]["exit_code"] == 3
    finally:
        assert core.proc.stdin is not None
        core.proc.stdin.close()
        assert core.proc.wait(timeout=10) == 0


def _ping(c: Corral) -> dict[str, Any]:
    """The engine's status; empty while it is not answering yet."""
    return poke(c.data, "ping") or {}


def test_sigkill_of_the_core_mid_run_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    c = Corral(tmp_path, FAST_CORE)
    try:
        runs, started = tmp_path / "runs", tmp_path / "started"
        script = f'echo "$$" >> {started}; sleep 1.5; echo "$CORRAL_JOB_ID" >> {runs}'
        ids = [c.submit("sh", "-c", script) for _ in range(4)]
        c.serve()
        eventually(
            lambda: started.exists() and len(started.read_text().split()) == 4,
            what="four attempts running",
        )
        first = eventually(lambda: _ping(c), what="the engine")
        os.kill(first["core_pid"], signal.SIGKILL)
        for job_id in ids:
            assert c.wait(job_id) == 0
        assert sorted(runs.read_text().split()) == sorted(ids)
        assert all(len(c.job(i)["attempts"]) == 1 for i in ids)
        after = _ping(c)
        assert after["core_restarts"] == 1 and after["core_pid"] != first["core_pid"]
        assert not any(alive(int(p)) for p in started.read_text().split())
    finally:
        c.stop_all()


def test_a_sigkilled_engine_takes_its_core_at_once_and_its_attempt_runs_on(
    tmp_path: Path,
) -> None:
    """The core dies with its engine (`corral core --with-parent`), not when it reads the end of
    its link: a core held stopped, which could never read it, is gone once its engine is. The
    attempt runs on under its shim, and the next engine collects it."""
    c = Corral(tmp_path)
    core = 0
    try:
        started = tmp_path / "started"
        job = c.submit("sh", "-c", f"touch {started}; sleep 2")
        engine = c.serve()
        eventually(started.exists, what="the attempt running")
        core = eventually(lambda: _ping(c).get("core_pid"), what="the engine")
        os.kill(core, signal.SIGSTOP)
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        eventually(lambda: not alive(core), what="the core gone with its engine")
        c.serve()
        assert c.wait(job) == 0
        assert [a["state"] for a in c.job(job)["attempts"]] == ["SUCCEEDED"]
    finally:
        if core and alive(core):  # held stopped: nothing else would end it
            os.kill(core, signal.SIGKILL)
        c.stop_all()


def test_a_stopped_core_misses_heartbeats_and_is_replaced(tmp_path: Path) -> None:
    c = Corral(tmp_path, FAST_CORE)
    try:
        c.serve()
        assert c.wait(c.submit("true")) == 0
        stuck = _ping(c)["core_pid"]
        os.kill(stuck, signal.SIGSTOP)
        fresh = eventually(
            lambda: _ping(c).get("core_pid") not in (None, stuck) and _ping(c)["core_pid"],
            what="a new core",
        )
        assert fresh != stuck and not alive(stuck)
        assert c.wait(c.submit("true")) == 0, "the new core grants and runs work"
    finally:
        c.stop_all()


def _crash_loop(c: Corral) -> None:
    """Kill the core until the supervisor gives up (budget: 3 restarts in the window)."""
    for _ in range(4):
        pid = eventually(lambda: _ping(c).get("core_pid"), what="a core")
        os.kill(pid, signal.SIGKILL)
        eventually(
            lambda p=pid: (
                _ping(c).get("core_pid") not in (None, p) or _ping(c).get("core_given_up")
            ),
            what="the supervisor to react",
        )
    assert eventually(lambda: _ping(c).get("core_given_up"), what="the supervisor to give up")


def test_a_crash_loop_spends_the_restart_budget_and_escalates(tmp_path: Path) -> None:
    c = Corral(tmp_path, FAST_CORE)
    try:
        c.serve()
        _crash_loop(c)
        assert "restart budget spent" in c.engine_log()
        escalations = json.loads(c.ok("escalations", "list", "--json"))
        assert [(e["scope"], e["reason"]) for e in escalations] == [("global", "core_crash_loop")]
        job_id = c.submit("true")
        assert c.wait(job_id, timeout=1.5) == 124, "no new work is started after giving up"
    finally:
        c.stop_all()


def test_clearing_a_crash_loop_brings_the_core_back_and_work_runs(tmp_path: Path) -> None:
    c = Corral(tmp_path, FAST_CORE)
    try:
        c.serve()
        _crash_loop(c)
        status = c.ok("status")
        assert "core not running" in status and "escalations clear" in status
        assert _ping(c)["core_pid"] is None, "no dead core's pid shown as if it ran"
        waiting = c.submit("true")
        [escalation] = json.loads(c.ok("escalations", "list", "--json"))
        cleared = json.loads(c.ok("escalations", "clear", escalation["id"], "--json"))
        assert cleared["cleared"] is True and cleared["core"]["restart_budget"] == 3
        eventually(lambda: _ping(c).get("core_connected"), what="the core back")
        assert c.wait(waiting) == 0, "the job that waited through the crash loop runs"
        assert c.wait(c.submit("true")) == 0, "and new work runs"
        assert json.loads(c.ok("escalations", "list", "--json")) == []
        pid = _ping(c)["core_pid"]
        assert pid and alive(pid)
        os.kill(pid, signal.SIGKILL)  # the budget is fresh: a crash is a restart again
        eventually(lambda: _ping(c).get("core_pid") not in (None, pid), what="a restart")
        assert not _ping(c)["core_given_up"]
    finally:
        c.stop_all()


def test_a_slow_start_check_and_a_refusal_never_cost_the_core_its_heartbeats(
    tmp_path: Path,
) -> None:
    """The first start of a worker kind asks its CLI's version (seconds for a node CLI on a
    loaded machine): heartbeats sent meanwhile are answered at once, and the refused attempt
    is answered `rejected`; the core goes on beating and granting."""
    cli = tmp_path / "slow-cli"
    cli.write_text("#!/bin/sh\nsleep 3\necho 2.1.330\n")
    cli.chmod(0o755)
    c = Corral(tmp_path, CONFIG + f"workers:\n  claude-code:\n    binary: {cli}\n")
    core = CoreProcess(c)
    try:
        assert core.recv()["type"] == "hello"
        job = {**_job("j-slow", str(tmp_path), []), "worker": "claude-code", "prompt": "hi"}
        granted = core.ask({"type": "request_permit", "job": job, "attempt": 1})
        assert granted["type"] == "permit"
        permit = granted["permit"]
        changed = {**job, "options": {"model": "another"}}  # not the job the permit is for
        core.send(
            {
                "type": "submit_job",
                "id": 1,
                "job": changed,
                "attempt": attempt("j-slow", permit, str(tmp_path / "attempt")),
                "permit": permit,
            }
        )
        core.send({"type": "heartbeat", "id": 2, "seq": 1})
        first = core.until(lambda m: m.get("id") in (1, 2))
        assert first["type"] == "heartbeat", f"a start check held the heartbeat back: {first}"
        refused = core.until(lambda m: m.get("id") == 1)
        assert refused["type"] == "rejected" and refused["reason"] == "PERMIT_WRONG_JOB"
        assert not (tmp_path / "attempt").exists()
        for seq in range(2, 5):
            beat = core.ask({"type": "heartbeat", "seq": seq})
            assert beat["type"] == "heartbeat" and beat["seq"] == seq
        other = _job("j-after", str(tmp_path), ["true"])
        assert core.ask({"type": "request_permit", "job": other, "attempt": 1})["type"] == "permit"
    finally:
        assert core.close() == 0
