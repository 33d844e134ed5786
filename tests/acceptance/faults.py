"""What must hold after every fault test (issue: keep running through faults).

Jobs under fault tests run `tracked(...)`: the script records `job attempt pid` in a runs file
when it starts, so the check can tell which attempt's command ran how often and which processes
belong to which job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.runtime.control import poke
from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.helpers import eventually

STATES = {"QUEUED", "AWAITING_APPROVAL", "STARTING", "RUNNING", "RETRY_WAIT", "SUCCEEDED",
          "FAILED", "DEAD_LETTERED", "TIMED_OUT", "CANCELLED", "KILLED", "DENIED"}
TERMINAL = {"SUCCEEDED", "FAILED", "DEAD_LETTERED", "TIMED_OUT", "CANCELLED", "KILLED",
            "DENIED"}


def tracked(runs: Path, body: str) -> tuple[str, ...]:
    """A command that records its start in `runs`, then runs the shell `body`."""
    return ("sh", "-c", f'echo "$CORRAL_JOB_ID $CORRAL_ATTEMPT $$" >> {runs}; {body}')


def runs_of(runs: Path) -> list[tuple[str, int, int]]:
    if not runs.exists():
        return []
    out = []
    for line in runs.read_text().splitlines():
        job, attempt, pid = line.split()
        out.append((job, int(attempt), int(pid)))
    return out


def _jobs(c: Corral) -> dict[str, dict[str, Any]]:
    listed = c.json("jobs", "--limit", "10000")
    jobs = {j["id"]: j for j in listed}
    assert len(jobs) == len(listed), "a job listed twice"
    return jobs


def check_invariants(c: Corral, runs: Path) -> None:
    """Every job in one known state, terminal states absorbing, each attempt's command run at
    most once, no process of a finished job alive, permits equal to attempts in flight, and the
    engine answering and running a new job."""
    before = _jobs(c)
    assert all(j["state"] in STATES for j in before.values()), before
    starts = runs_of(runs)
    seen = [(job, attempt) for job, attempt, _ in starts]
    assert len(seen) == len(set(seen)), f"an attempt's command ran twice: {sorted(seen)}"
    for job_id, attempt in seen:  # no command ran outside an attempt the store knows of
        assert attempt <= before[job_id]["attempts"], (job_id, attempt)
    ended = {j for j, job in before.items() if job["state"] in TERMINAL}
    eventually(lambda: not any(alive(pid) for job, _, pid in starts if job in ended),
               what="no process of a finished job alive")

    assert poke(c.data, "ping"), "the engine answers"
    new = c.submit(*tracked(runs, "true"))
    assert c.wait(new) == 0, c.engine_log()

    after = _jobs(c)
    for job_id in ended:  # terminal states are absorbing
        assert after[job_id]["state"] == before[job_id]["state"], job_id
        assert after[job_id]["attempts"] == before[job_id]["attempts"], job_id

    def permits_match() -> bool:
        snap = c.json("status")
        inflight = sum(1 for j in _jobs(c).values() if j["state"] in ("STARTING", "RUNNING"))
        return bool(snap["permits"]["live"] == inflight)

    eventually(permits_match, what="permits equal to attempts in flight")
