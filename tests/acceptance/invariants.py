"""What must hold after any fault (issue 12, "Done means"), checked through the real `corral`
command: every job in one state, terminal states absorbing, each attempt's command run at most
once, no process of a finished job alive, as many permits as attempts in flight, and the engine
answering and running a new job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.workers.process import attempt_processes
from tests.acceptance.conftest import Corral
from tests.helpers import eventually

TERMINAL = {"SUCCEEDED", "FAILED", "DEAD_LETTERED", "TIMED_OUT", "CANCELLED", "KILLED", "DENIED"}
IN_FLIGHT = {"STARTING", "RUNNING"}

# Appends "<job id> <attempt>" to $RUNS once per start of the command: the record of how often
# each attempt's command ran.
RAN = 'echo "$CORRAL_JOB_ID $CORRAL_ATTEMPT" >> "$RUNS"; '


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _permits(c: Corral) -> int:
    return int(c.json("status")["permits"]["live"])


def invariants(c: Corral, runs: Path) -> None:
    """What must hold after any fault (issue 12, "Done means")."""
    listed: list[dict[str, Any]] = c.json("jobs", "--limit", "500")
    ids = [j["id"] for j in listed]
    assert len(ids) == len(set(ids)), "every job listed once"
    jobs = {i: c.job(i) for i in ids}
    for j in listed:  # one state: the list and the job itself agree
        assert jobs[j["id"]]["state"] == j["state"] or j["state"] not in TERMINAL

    # Each attempt's command ran at most once.
    seen = lines(runs)
    assert len(seen) == len(set(seen)), f"an attempt's command ran twice: {seen}"

    # No process of a finished job (or of an ended attempt) is alive.
    for job in jobs.values():
        for a in job["attempts"]:
            if (job["state"] in TERMINAL or a["state"] not in IN_FLIGHT) and a["log_dir"]:
                assert attempt_processes(Path(a["log_dir"])) == [], (
                    f"job {job['id']} attempt {a['index']} ({a['state']}) left processes")

    # As many permits as attempts in flight (the engine settles them within a moment).
    def balanced() -> bool:
        in_flight = sum(1 for j in c.json("jobs", "--limit", "500") if j["state"] in IN_FLIGHT)
        return _permits(c) == in_flight
    eventually(balanced, what="permits equal to attempts in flight")

    # The engine answers and runs a new job; terminal states stayed as they were.
    fresh = c.submit("sh", "-c", "echo fresh")
    assert c.wait(fresh) == 0, c.engine_log()[-3000:]
    for job_id, job in jobs.items():
        if job["state"] in TERMINAL:
            again = c.job(job_id)
            assert (again["state"], again["updated_at"], len(again["attempts"])) == (
                job["state"], job["updated_at"], len(job["attempts"])), "terminal is absorbing"


