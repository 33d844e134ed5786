"""What must hold after any fault, checked through the real `corral` command: every job in one
known state, terminal states absorbing, each attempt's command run at most once, no process of
a finished job (or of an ended attempt) alive, as many permits as attempts in flight, and the
engine answering and running a new job.

Jobs under fault tests record each start of their command, `job attempt pid`, in a runs file:
`tracked(runs, body)` builds such a command, `RAN` is the same record for a script that gets
the file's path in `$RUNS` (`--setenv RUNS=…`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.domain import states
from corral.runtime.control import poke
from corral.workers.process import attempt_processes
from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.helpers import eventually

STATES = {
    "QUEUED",
    "AWAITING_APPROVAL",
    "STARTING",
    "RUNNING",
    "RETRY_WAIT",
    "SUCCEEDED",
    "FAILED",
    "DEAD_LETTERED",
    "TIMED_OUT",
    "CANCELLED",
    "KILLED",
    "DENIED",
}
TERMINAL = {state.value for state in states.TERMINAL}
IN_FLIGHT = {"STARTING", "RUNNING"}

RAN = 'echo "$CORRAL_JOB_ID $CORRAL_ATTEMPT $$" >> "$RUNS"; '


def tracked(runs: Path, body: str) -> tuple[str, ...]:
    """A command that records its start in `runs`, then runs the shell `body`."""
    return ("sh", "-c", f'echo "$CORRAL_JOB_ID $CORRAL_ATTEMPT $$" >> {runs}; {body}')


def runs_of(runs: Path) -> list[tuple[str, int, int]]:
    """(job, attempt, pid) of every start recorded in `runs`, in order."""
    if not runs.exists():
        return []
    out = []
    for line in runs.read_text().splitlines():
        job, attempt, pid = line.split()
        out.append((job, int(attempt), int(pid)))
    return out


def _listed(c: Corral) -> dict[str, dict[str, Any]]:
    listed = c.json("jobs", "--limit", "10000")
    jobs = {j["id"]: j for j in listed}
    assert len(jobs) == len(listed), "a job listed twice"
    return jobs


def invariants(c: Corral, runs: Path) -> None:
    """Check every invariant above on `c`, whose jobs recorded their starts in `runs`."""
    listed = _listed(c)
    assert all(j["state"] in STATES for j in listed.values()), listed
    jobs = {job_id: c.job(job_id) for job_id in listed}
    for job_id, j in listed.items():  # one state: the list and the job itself agree
        assert jobs[job_id]["state"] == j["state"] or j["state"] not in TERMINAL, job_id

    starts = runs_of(runs)
    seen = [(job, attempt) for job, attempt, _ in starts]
    assert len(seen) == len(set(seen)), f"an attempt's command ran twice: {sorted(seen)}"
    for job_id, attempt in seen:  # no command ran outside an attempt the store knows of
        assert attempt <= len(jobs[job_id]["attempts"]), (job_id, attempt)

    ended = {job_id for job_id, job in jobs.items() if job["state"] in TERMINAL}

    def nothing_of_ended_alive() -> bool:
        if any(alive(pid) for job, _, pid in starts if job in ended):
            return False
        return not any(
            attempt_processes(Path(a["log_dir"]))
            for job in jobs.values()
            for a in job["attempts"]
            if a["log_dir"] and (job["id"] in ended or a["state"] not in IN_FLIGHT)
        )

    eventually(nothing_of_ended_alive, what="no process of a finished job or attempt alive")

    assert poke(c.data, "ping"), "the engine answers"
    fresh = c.submit(*tracked(runs, "true"))
    assert c.wait(fresh) == 0, c.engine_log()[-3000:]

    for job_id in ended:  # terminal states are absorbing
        again = c.job(job_id)
        assert (again["state"], again["updated_at"], len(again["attempts"])) == (
            jobs[job_id]["state"],
            jobs[job_id]["updated_at"],
            len(jobs[job_id]["attempts"]),
        ), f"job {job_id}: a terminal state changed"

    def permits_match() -> bool:
        in_flight = sum(1 for j in _listed(c).values() if j["state"] in IN_FLIGHT)
        return bool(c.json("status")["permits"]["live"] == in_flight)

    eventually(permits_match, what="permits equal to attempts in flight")
