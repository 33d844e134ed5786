"""The `command` worker: any argv, run under the shim in its own session with logs on disk."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.domain.models import Attempt, AttemptResult, Job, Permit
from corral.domain.settings import Settings
from corral.domain.states import Outcome
from corral.workers import process
from corral.workers.process import Output, ShimProcess, ShimResult
from corral.workers.sealing import Keeper, reveal_job

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
    "output": Outcome.EXITED,  # stopped at the output cap: `limit_hit = output` says why
    "lost": Outcome.LOST,
}
OUTPUT_LIMIT = "output"


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """What starting any attempt needs besides its permit: the key that opens the job's sealed
    secrets, and the output bounds of its role."""

    keeper: Keeper | None = None
    settings: Settings | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def prepare(self, job: Job) -> tuple[Job, Output]:
        """The job as it really runs (its secrets back in), and how its output is kept."""
        revealed = reveal_job(job, self.keeper, self.environ)
        if self.settings is None:
            return revealed.job, Output(secrets=revealed.secrets)
        return revealed.job, Output(max_bytes=self.settings.max_output_bytes(job.role),
                                    tail_bytes=self.settings.output.tail_bytes,
                                    secrets=revealed.secrets)


def to_result(r: ShimResult) -> AttemptResult:
    """The shim's record, in the domain's words."""
    outcome = _OUTCOME.get(r.reason, Outcome.LOST)
    error = r.error
    limit = "max_duration_s" if outcome is Outcome.TIMED_OUT else None
    if outcome is Outcome.TIMED_OUT:
        error = error or "deadline reached: process tree stopped"
    if r.reason == "output":
        limit = OUTPUT_LIMIT
        error = error or ("output cap reached: the job was stopped; its log keeps the first "
                          "part and the last part of what it wrote")
    return AttemptResult(
        outcome=outcome, exit_code=r.exit_code, signal=r.signal, error=error, limit_hit=limit,
        started_at=r.started_at_ms / 1000 if r.started_at_ms else None,
        ended_at=r.ended_at_ms / 1000 if r.ended_at_ms else None)


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

    def __init__(self, validate: Callable[[Permit], None], kind: str = "command",
                 launch: Launch | None = None) -> None:
        self._validate = validate
        self.kind = kind
        self.launch = launch or Launch()

    def argv(self, job: Job) -> list[str]:
        return list(job.command)

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> ShimAttempt:
        self._validate(permit)  # no process without a live permit, whoever calls
        job, output = self.launch.prepare(job)
        proc = process.spawn(
            attempt_dir=Path(attempt.dir), argv=self.argv(job), cwd=job.cwd,
            env={**job_env(job.with_(attempts=attempt.index)), "CORRAL_WORKER": self.kind},
            grace_s=permit.grace_s,
            deadline_epoch_s=permit.deadline_at, output=output)
        return ShimAttempt(proc)

    def adopt(self, job: Job, attempt: Attempt) -> ShimAttempt | AttemptResult:
        found = process.probe(Path(attempt.dir))
        if found.state == "running" and found.process is not None:
            return ShimAttempt(found.process)
        if found.state == "finished" and found.result is not None:
            return to_result(found.result)
        if found.state == "vanished":
            return AttemptResult(outcome=Outcome.LOST,
                                 error="process vanished while the engine was down")
        return AttemptResult(outcome=Outcome.LOST,
                             error="engine stopped before the process started")
