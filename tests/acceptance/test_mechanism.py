"""The core mechanism through the running engine with real processes: breakers fed by real
failing workers, fallback kinds, the watchdog shedding under a stall, crash-loop escalation."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from corral.runtime.control import poke
from tests.acceptance.conftest import Corral, alive
from tests.helpers import eventually

BASE = """\
scheduler: {poll_interval_s: 0.1}
core: {heartbeat_s: 0.5, heartbeat_timeout_s: 5}
environments:
  local: {max_inflight: 8}
workers:
  alpha: {adapter: command}
  beta: {adapter: command}
"""


def _snapshot(c: Corral) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(c.ok("status", "--json"))
    return data


def _breaker(c: Corral, name: str) -> dict[str, Any]:
    return next((b for b in _snapshot(c)["breakers"] if b["name"] == name), {})


def _attempt_times(c: Corral, job_id: str) -> tuple[str, str]:
    a = c.job(job_id)["attempts"][-1]
    return a["started"], a["ended"]


def worker_crash(c: Corral) -> str:
    """A real failure of the worker, not of the job: a job's `corral-shim` SIGKILLed while its
    command runs. The attempt is LOST (the worker's fault). The command goes first, while the
    shim is stopped (it cannot see it end), so nothing of the job survives its supervisor."""
    job = c.submit("sleep", "60")
    assert c.wait(job, until="running") == 0
    attempt = Path(c.job(job)["attempts"][-1]["log_dir"])
    shim, child = (int((attempt / f).read_text()) for f in ("shim.pid", "child.pid"))
    os.kill(shim, signal.SIGSTOP)
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    eventually(lambda: not alive(child), what="the job's command to die")
    os.kill(shim, signal.SIGKILL)
    assert c.wait(job) != 0
    [a] = c.job(job)["attempts"]
    assert a["state"] == "LOST", a
    return job


def test_breaker_opens_on_real_failures_and_closes_through_one_probe(tmp_path: Path) -> None:
    c = Corral(
        tmp_path,
        BASE
        + """\
breakers: {min_calls: 3, consecutive_failures: 3, open_s: 1.0, window_s: 60}
roles:
  default: {concurrency: 4, limits: {max_attempts: 1}}
""",
    )
    try:
        c.serve()
        for _ in range(3):
            worker_crash(c)
        opened = eventually(
            lambda: (
                _breaker(c, "worker:command").get("state") == "OPEN"
                and _breaker(c, "worker:command")
            ),
            what="the breaker to open",
        )
        assert opened["state"] == "OPEN"
        gate = tmp_path / "probe-gate"  # the probe runs until the others were refused
        probe = c.submit("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
        others = [c.submit("sh", "-c", "sleep 0.2") for _ in range(3)]
        eventually(
            lambda: any(
                e["kind"] == "permit_rejected" for j in others for e in c.job(j)["timeline"]
            ),
            what="the others refused while the probe runs",
        )
        gate.touch()
        for job_id in (probe, *others):
            assert c.wait(job_id) == 0
        probe_end = _attempt_times(c, probe)[1]
        # exactly one probe ran while HALF_OPEN: the others started only after it closed
        assert all(_attempt_times(c, j)[0] >= probe_end for j in others)
        rejected = [
            e for j in others for e in c.job(j)["timeline"] if e["kind"] == "permit_rejected"
        ]
        assert rejected and {e["data"]["reason"] for e in rejected} == {"CIRCUIT_OPEN"}
        closed = _breaker(c, "worker:command")
        assert closed["state"] == "CLOSED"
        history = [h.get("to", h.get("state")) for h in closed["history"]]
        assert history[-3:] == ["OPEN", "HALF_OPEN", "CLOSED"]
        listed = json.loads(c.ok("breakers", "--json"))
        assert any(b["name"] == "worker:command" for b in listed)
        recorded = eventually(
            lambda: (
                [e["state"] for e in json.loads(c.ok("events", "--kind", "breaker", "--json"))][-3:]
                == ["OPEN", "HALF_OPEN", "CLOSED"]
            ),
            what="the transitions to be recorded in the store",
        )
        assert recorded
    finally:
        c.stop_all()


def test_an_open_breaker_sends_the_role_to_its_fallback_kind(tmp_path: Path) -> None:
    c = Corral(
        tmp_path,
        BASE
        + """\
breakers: {min_calls: 2, consecutive_failures: 2, open_s: 300}
roles:
  default: {worker: alpha, fallback_workers: [beta], concurrency: 2, limits: {max_attempts: 1}}
""",
    )
    try:
        c.serve()
        script = 'test "$CORRAL_WORKER" = beta'  # only the fallback kind can do this job
        assert c.run("submit", "--wait", "--", "sh", "-c", script).returncode == 1
        assert _breaker(c, "worker:alpha").get("state") == "CLOSED", "a job's failure"
        for _ in range(2):
            worker_crash(c)
        eventually(
            lambda: _breaker(c, "worker:alpha").get("state") == "OPEN",
            what="alpha's breaker to open",
        )
        assert c.run("submit", "--wait", "--", "sh", "-c", script).returncode == 0
        assert c.json("breakers", "reset", "worker:alpha") == {
            "breaker": "worker:alpha",
            "state": "CLOSED",
        }
        assert _breaker(c, "worker:alpha")["state"] == "CLOSED"
    finally:
        c.stop_all()


def test_the_watchdog_sheds_low_priority_work_under_a_stall_and_recovers(tmp_path: Path) -> None:
    c = Corral(
        tmp_path,
        BASE
        + """\
watchdog:
  stall_s: 0.5
  recover_s: 0.5
  shed_min_priority: 3
  stalled_attempts: {shed: 1}
roles:
  default: {concurrency: 4}
""",
    )
    try:
        c.serve()
        silent = c.submit("sleep", "600", opts=("--priority", "1"))  # silent: a stall
        eventually(
            lambda: _snapshot(c)["watchdog"]["stage_name"] != "normal",
            what="the watchdog to react to the stall",
        )
        low = c.submit("true", opts=("--priority", "4"))
        urgent = c.submit("true", opts=("--priority", "0"))
        assert c.wait(urgent) == 0, "work above the shed line still runs"
        assert c.job(low)["state"] == "QUEUED", "backlog work is shed while the stall lasts"
        c.ok("cancel", silent)
        assert c.wait(silent) == 130
        assert c.wait(low) == 0, "the stage steps down and shed work runs"
        reasons = {
            e["data"]["reason"] for e in c.job(low)["timeline"] if e["kind"] == "permit_rejected"
        }
        assert reasons == {"QUEUE_STALL"}
        assert _snapshot(c)["watchdog"]["stage_name"] == "normal"
    finally:
        c.stop_all()


def test_a_crash_loop_isolates_the_worker_kind_until_an_operator_clears_it(tmp_path: Path) -> None:
    c = Corral(
        tmp_path,
        BASE
        + """\
escalation: {crash_loop_per_min: 3}
breakers: {min_calls: 100, consecutive_failures: 100}
roles:
  default: {worker: alpha, concurrency: 4, limits: {max_attempts: 1}}
""",
    )
    try:
        c.serve()
        for _ in range(4):  # a job's own command dying of a signal is no crash of the worker
            assert c.run("submit", "--wait", "--", "sh", "-c", "kill -9 $$").returncode == 1
        assert json.loads(c.ok("escalations", "list", "--json")) == []
        for _ in range(3):  # each attempt's supervisor dies: the worker crashed
            worker_crash(c)
        items = eventually(
            lambda: json.loads(c.ok("escalations", "list", "--json")), what="an escalation"
        )
        assert [(e["scope"], e["target"], e["reason"]) for e in items] == [
            ("workerKind", "alpha", "crash_loop")
        ]
        blocked = c.submit("true")
        assert c.wait(blocked, timeout=1.0) == 124, "an isolated kind gets no permits"
        reasons = {
            e["data"]["reason"]
            for e in c.job(blocked)["timeline"]
            if e["kind"] == "permit_rejected"
        }
        assert reasons == {"FATAL_MODE"}
        assert c.json("escalations", "clear", items[0]["id"]) == {
            "escalation": items[0]["id"],
            "cleared": True,
        }
        assert c.wait(blocked) == 0
        assert json.loads(c.ok("escalations", "list", "--json")) == []
    finally:
        c.stop_all()


def test_a_restarted_core_resumes_open_breakers(tmp_path: Path) -> None:
    c = Corral(
        tmp_path,
        BASE
        + """\
core: {heartbeat_s: 0.2, heartbeat_timeout_s: 10}  # a kill, not a busy machine, restarts it
breakers: {min_calls: 2, consecutive_failures: 2, open_s: 300}
roles:
  default: {concurrency: 2, limits: {max_attempts: 1}}
""",
    )
    try:
        c.serve()
        for _ in range(2):
            worker_crash(c)
        eventually(
            lambda: _breaker(c, "worker:command").get("state") == "OPEN", what="the breaker to open"
        )
        [row] = [
            line for line in c.ok("breakers").splitlines() if line.startswith("worker:command")
        ]
        # since when it is OPEN, and when it lets a probe through: times, not "-"
        assert re.search(r"OPEN\s+│\s+\d\d:\d\d:\d\d\s+│\s+\d\d:\d\d:\d\d", row), row
        recorded = eventually(
            lambda: c.ok("events", "--kind", "breaker").strip(), what="the transition recorded"
        )
        assert " worker:command → OPEN " in recorded and "worker:worker" not in recorded
        held = c.submit("true")  # `wait` says why it does not start, and until when
        r = c.run("wait", held, "--timeout", "3")
        assert r.returncode == 124
        assert f"{held[-6:]} is QUEUED: breaker worker:command is OPEN until " in r.stderr, r.stderr
        before = eventually(
            lambda: (a := poke(c.data, "ping")) and a["core_state_synced"] and a,
            what="the engine to hold the core's state",
        )
        os.kill(before["core_pid"], signal.SIGKILL)
        eventually(
            lambda: (poke(c.data, "ping") or {}).get("core_pid") not in (None, before["core_pid"]),
            what="a new core",
        )
        assert eventually(
            lambda: _breaker(c, "worker:command").get("state") == "OPEN",
            what="the breaker restored into the new core",
        )
    finally:
        c.stop_all()
