"""The core's invariants hold for any scheduler: the real `corral core`, driven over stdio as a
foreign scheduler would, refuses what it must and starts nothing for it.

A permit starts exactly one attempt of the job and attempt index it was issued for, once, before
its deadline; max attempts are counted by the core; an unused permit lapses at its deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.acceptance.conftest import Corral
from tests.acceptance.corewire import CoreProcess, attempt, job
from tests.helpers import eventually


def _permit(core: CoreProcess, j: dict[str, Any], index: int = 1) -> dict[str, Any]:
    reply = core.ask({"type": "request_permit", "job": j, "attempt": index})
    assert reply["type"] == "permit", reply
    permit: dict[str, Any] = reply["permit"]
    return permit


def _submit(
    core: CoreProcess, j: dict[str, Any], a: dict[str, Any], permit: dict[str, Any]
) -> dict[str, Any]:
    return core.ask({"type": "submit_job", "job": j, "attempt": a, "permit": permit})


def _beat(core: CoreProcess) -> dict[str, Any]:
    return core.ask({"type": "heartbeat", "seq": 1})


def test_one_permit_starts_one_attempt_of_its_own_job_once(corral: Corral, tmp_path: Path) -> None:
    core = CoreProcess(corral)
    tmp_path = tmp_path / "attempts"  # attempt directories: none may appear for a refusal
    runs = tmp_path / "runs"  # each job that runs touches its name here
    runs.mkdir(parents=True)
    try:
        assert core.recv()["type"] == "hello"
        jobs = {
            name: job(name, str(runs), ["sh", "-c", f"touch {name}; exec sleep 30"], role="serial")
            for name in ("A", "B", "C", "D")
        }
        permit = _permit(core, jobs["A"])  # role `serial` has concurrency 1: one slot

        # The same permit for other jobs (the issue: it started four): refused, nothing runs.
        for other in ("B", "C", "D"):
            refused = _submit(
                core, jobs[other], attempt(other, permit, str(tmp_path / other)), permit
            )
            assert (refused["type"], refused["reason"]) == ("rejected", "PERMIT_WRONG_JOB")
            assert refused["job_id"] == other and f"not for job {other}" in refused["message"]
        changed = {**jobs["A"], "command": ["sh", "-c", "touch X"], "role": "default"}
        refused = _submit(core, changed, attempt("A", permit, str(tmp_path / "A")), permit)
        assert refused["reason"] == "PERMIT_WRONG_JOB", "a changed job is another job"
        refused = _submit(core, jobs["A"], attempt("A", permit, str(tmp_path / "A2"), 2), permit)
        assert refused["reason"] == "PERMIT_WRONG_ATTEMPT"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"], "no attempt started"
        assert list(runs.iterdir()) == []

        started = _submit(core, jobs["A"], attempt("A", permit, str(tmp_path / "A")), permit)
        assert started["type"] == "job_started"
        again = _submit(core, jobs["A"], attempt("A", permit, str(tmp_path / "A-again")), permit)
        assert (again["type"], again["reason"]) == ("rejected", "PERMIT_USED")
        reused = _submit(core, jobs["B"], attempt("B", permit, str(tmp_path / "B")), permit)
        assert reused["reason"] == "PERMIT_WRONG_JOB"
        beat = _beat(core)
        assert (beat["inflight"], beat["permits"]) == (1, 1)

        eventually(lambda: (runs / "A").exists(), what="A running")
        core.send({"type": "cancel_job", "job_id": "A", "now": True})
        done = core.until(lambda m: m["type"] == "job_completed")
        assert done["job_id"] == "A" and done["result"]["outcome"] == "cancelled"
        replay = _submit(core, jobs["A"], attempt("A", permit, str(tmp_path / "A-replay")), permit)
        assert (replay["type"], replay["reason"]) == ("rejected", "PERMIT_USED")
        assert sorted(p.name for p in runs.iterdir()) == ["A"], "only A ever ran, once"
        assert not (tmp_path / "A-replay").exists() and not (tmp_path / "B").exists()
        beat = _beat(core)
        assert (beat["inflight"], beat["permits"]) == (0, 0)

        gone = core.ask({"type": "cancel_job", "job_id": "A"})
        assert gone["type"] == "error" and gone["job_id"] == "A"
        assert gone["error"] == "cancel_job: no running attempt of job A"
    finally:
        assert core.close() == 0


def test_attempts_past_the_maximum_are_refused_whatever_index_is_asked(
    corral: Corral, tmp_path: Path
) -> None:
    core = CoreProcess(corral)
    try:
        assert core.recv()["type"] == "hello"
        marker = tmp_path / "ran"
        j = job("M", str(tmp_path), ["sh", "-c", f"echo x >> {marker}; exit 1"], max_attempts=2)
        past = core.ask({"type": "request_permit", "job": j, "attempt": 5})
        assert (past["type"], past["reason"], past["final"]) == ("rejected", "MAX_ATTEMPTS", True)
        assert "attempt 5 of job M is past its max_attempts 2" in past["message"]

        first = _permit(core, j, 1)
        assert (
            _submit(core, j, attempt("M", first, str(tmp_path / "1")), first)["type"]
            == "job_started"
        )
        core.until(lambda m: m["type"] == "job_completed")
        repeated = core.ask({"type": "request_permit", "job": j, "attempt": 1})
        assert (repeated["reason"], repeated["final"]) == ("ATTEMPT_REPEATED", True)
        second = _permit(core, j, 2)
        assert (
            _submit(core, j, attempt("M", second, str(tmp_path / "2")), second)["type"]
            == "job_started"
        )
        core.until(lambda m: m["type"] == "job_completed")
        third = core.ask({"type": "request_permit", "job": j, "attempt": 3})
        assert third["reason"] == "MAX_ATTEMPTS"
        assert marker.read_text().split() == ["x", "x"], "two attempts ran, no more"
        core.seen.append(core.until(lambda m: m["type"] == "event"))  # the last refusal's
        refusals = [m["event"] for m in core.seen if m["type"] == "event"]
        assert [e["reason"] for e in refusals if e["kind"] == "rejection"] == [
            "MAX_ATTEMPTS",
            "ATTEMPT_REPEATED",
            "MAX_ATTEMPTS",
        ]
    finally:
        assert core.close() == 0


def test_an_unused_permit_lapses_frees_its_slot_and_starts_nothing(
    corral: Corral, tmp_path: Path
) -> None:
    core = CoreProcess(corral)
    try:
        assert core.recv()["type"] == "hello"
        marker = tmp_path / "ran"
        j = job("E", str(tmp_path), ["touch", str(marker)], role="serial", timeout_s=1)
        permit = _permit(core, j)
        waiting = job("W", str(tmp_path), ["true"], role="serial")
        full = core.ask({"type": "request_permit", "job": waiting, "attempt": 1})
        assert (full["reason"], full["saturated"]["roles"]) == ("BUDGET_EXHAUSTED", ["serial"])

        lapsed = core.until(
            lambda m: m["type"] == "event" and m["event"]["kind"] == "permit", timeout=10
        )
        assert lapsed["event"]["state"] == "expired"
        assert lapsed["event"]["data"]["permit_id"] == permit["id"]
        assert lapsed["saturated"]["roles"] == [], "its slot is free again"
        assert _beat(core)["permits"] == 0

        refused = _submit(core, j, attempt("E", permit, str(tmp_path / "E")), permit)
        assert (refused["type"], refused["reason"]) == ("rejected", "PERMIT_EXPIRED")
        assert not marker.exists() and not (tmp_path / "E").exists()
        assert _permit(core, waiting)["job_id"] == "W"
    finally:
        assert core.close() == 0


def test_blank_lines_are_ignored_and_cost_is_reported_for_known_jobs_only(
    corral: Corral, tmp_path: Path
) -> None:
    core = CoreProcess(corral)
    try:
        assert core.recv()["type"] == "hello"
        core.send_raw(b"\n   \n\r\n")
        assert _beat(core)["type"] == "heartbeat", "no error for the blank lines"
        unknown = core.ask({"type": "report_cost", "job_id": "nope", "cost_usd": 1})
        assert unknown["type"] == "error" and "job nope" in unknown["error"]
        j = job("R", str(tmp_path), ["sleep", "30"])
        permit = _permit(core, j)
        _submit(core, j, attempt("R", permit, str(tmp_path / "R")), permit)
        charged = core.ask({"type": "report_cost", "job_id": "R", "cost_usd": 0.25})
        assert (charged["type"], charged["job_cost_usd"]) == ("cost_reported", 0.25)
        bad = core.ask({"type": "report_cost", "job_id": "R", "cost_usd": -1})
        assert bad["type"] == "error" and "≥ 0" in bad["error"]
        core.send({"type": "cancel_job", "job_id": "R", "now": True})
        done = core.until(lambda m: m["type"] == "job_completed")
        assert done["result"]["cost_usd"] == 0.25, "the attempt's result carries its cost"
    finally:
        assert core.close() == 0
