"""The `command` worker: any argv, run under the shim in its own session with logs on disk."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from corral.domain.models import Attempt, AttemptResult, Job, Permit
from corral.domain.states import Fault, Outcome
from corral.workers import process
from corral.workers.faults import command_fault
from corral.workers.process import ShimProcess, ShimResult

# The environment a job starts from; everything else of the engine's own environment (database
# URLs, tokens) stays out unless the job asks for it by name (`corral submit --setenv`).
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR",
                 "TERM",
                 # so that `corral submit` inside a job reaches this engine (as the job's child)
                 "CORRAL_DATA_DIR", "CORRAL_CONFIG")

_OUTCOME = {
    "exited": Outcome.EXITED,
    "terminated": Outcome.CANCELLED,
    "deadline": Outcome.TIMED_OUT,
    "spawn_error": Outcome.SPAWN_ERROR,
    "lost": Outcome.LOST,
}


def to_result(r: ShimResult) -> AttemptResult:
    """The shim's record, in the domain's words."""
    outcome = _OUTCOME.get(r.reason, Outcome.LOST)
    error = r.error
    if outcome is Outcome.TIMED_OUT:
        error = error or "deadline reached: process tree stopped"
    result = AttemptResult(
        outcome=outcome, exit_code=r.exit_code, signal=r.signal, error=error,
        limit_hit="max_duration_s" if outcome is Outcome.TIMED_OUT else None,
        started_at=r.started_at_ms / 1000 if r.started_at_ms else None,
        ended_at=r.ended_at_ms / 1000 if r.ended_at_ms else None)
    return replace(result, fault=command_fault(result))


class ShimAttempt:
    """An attempt supervised through its shim; shared by every argv-based worker."""

    def __init__(self, proc: ShimProcess) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait(self) -> AttemptResult:
        try:
            return to_result(await self.proc.wait())
        finally:
            self.proc.close()

    def stop(self, *, now_kill: bool = False) -> None:
        if now_kill:
            self.proc.kill_now()
        else:
            self.proc.terminate()


def job_env(job: Job, base: Mapping[str, str] | None = None) -> dict[str, str]:
    src = os.environ if base is None else base
    env = {k: src[k] for k in BASE_ENV_KEYS if k in src}
    env.update(job.env)
    env["CORRAL_JOB_ID"] = job.id
    env["CORRAL_ATTEMPT"] = str(job.attempts)
    return env


class CommandWorker:
    """Runs `job.command`; also serves operator-defined kinds (`workers.K.adapter: command`)."""

    def __init__(self, validate: Callable[[Permit], None], kind: str = "command") -> None:
        self._validate = validate
        self.kind = kind

    def argv(self, job: Job) -> list[str]:
        return list(job.command)

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> ShimAttempt:
        self._validate(permit)  # no process without a live permit, whoever calls
        proc = process.spawn(
            attempt_dir=Path(attempt.dir), argv=self.argv(job), cwd=job.cwd,
            env={**job_env(job.with_(attempts=attempt.index)), "CORRAL_WORKER": self.kind},
            grace_s=permit.grace_s,
            deadline_epoch_s=permit.deadline_at)
        return ShimAttempt(proc)

    def adopt(self, job: Job, attempt: Attempt) -> ShimAttempt | AttemptResult:
        found = process.probe(Path(attempt.dir))
        if found.state == "running" and found.process is not None:
            return ShimAttempt(found.process)
        if found.state == "finished" and found.result is not None:
            return to_result(found.result)
        if found.state == "vanished":
            return AttemptResult(outcome=Outcome.LOST, fault=Fault.WORKER,
                                 error="process vanished while the engine was down")
        return AttemptResult(outcome=Outcome.LOST, fault=Fault.WORKER,
                             error="engine stopped before the process started")
