"""The `command` worker: any argv, run under the shim in its own session with logs on disk.

A command job may report what it cost (the model calls it made, a cloud bill) by writing a JSON
object to the file `$CORRAL_RESULT_FILE` names, e.g. `{"cost_usd": 0.42}`: it becomes the
attempt's `cost_usd`, charged like an agent's (docs/how-to/mechanism.md). The last content written
counts; write it whole (a temporary file renamed over it) so it is never read half written.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from corral.core.ports import AttemptRef
from corral.domain.bounds import MAX_USD, loads_bounded
from corral.domain.errors import WorkerMisconfigured
from corral.domain.models import Attempt, AttemptResult, Job, Permit
from corral.domain.settings import EnvSpec, Settings
from corral.domain.states import Fault, Outcome
from corral.workers import process, rayauth, rayjob, raywatch
from corral.workers.faults import command_fault
from corral.workers.notes import read_note
from corral.workers.process import Output, ShimProcess, ShimResult
from corral.workers.sealing import Keeper, reveal_job
from corral.workers.zygote import Zygote

# The environment a job starts from; everything else of the engine's own environment (database
# URLs, tokens) stays out unless the job asks for it by name (`corral submit --setenv`).
BASE_ENV_KEYS = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TERM",
    # so that `corral submit` inside a job reaches this engine (as the job's child)
    "CORRAL_DATA_DIR",
    "CORRAL_CONFIG",
)

log = logging.getLogger("corral.worker")

RESULT_FILE = "job-result.json"  # in the attempt directory; its path is $CORRAL_RESULT_FILE
RESULT_ENV = "CORRAL_RESULT_FILE"
SECRET_NAMES_ENV = "CORRAL_SECRET_NAMES"  # a training job's secret names (workers/training.py)
MAX_RESULT_BYTES = 64 * 1024

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
    secrets, the output bounds of its role, and the zygote its shim is forked by (None: the
    shim is exec'd)."""

    keeper: Keeper | None = None
    settings: Settings | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    zygote: Zygote | None = None

    def prepare(self, job: Job) -> tuple[Job, Output]:
        """The job as it really runs (its secrets back in), and how its output is kept."""
        revealed = reveal_job(job, self.keeper, self.environ)
        if self.settings is None:
            return revealed.job, Output(secrets=revealed.secrets)
        return revealed.job, Output(
            max_bytes=self.settings.max_output_bytes(job.role),
            tail_bytes=self.settings.output.tail_bytes,
            secrets=revealed.secrets,
        )


def to_result(r: ShimResult) -> AttemptResult:
    """The shim's record, in the domain's words."""
    outcome = _OUTCOME.get(r.reason, Outcome.LOST)
    error = r.error
    limit = "max_duration_s" if outcome is Outcome.TIMED_OUT else None
    if outcome is Outcome.TIMED_OUT:
        error = error or "deadline reached: process tree stopped"
    if r.reason == "output":
        limit = OUTPUT_LIMIT
        error = error or (
            "output cap reached: the job was stopped; its log keeps the first "
            "part and the last part of what it wrote"
        )
    result = AttemptResult(
        outcome=outcome,
        exit_code=r.exit_code,
        signal=r.signal,
        error=error,
        limit_hit=limit,
        started_at=r.started_at_ms / 1000 if r.started_at_ms else None,
        ended_at=r.ended_at_ms / 1000 if r.ended_at_ms else None,
    )
    return replace(result, fault=command_fault(result))


def reported_cost(path: Path) -> tuple[float | None, str | None]:
    """(cost, problem) from a job's result file: (None, None) when it wrote none; a file that is
    not a JSON object with a finite `cost_usd` ≥ 0 gives a problem (one line) and no cost."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_RESULT_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot read it: {err.strerror or err}"
    if len(raw) > MAX_RESULT_BYTES:
        return None, f"it is larger than {MAX_RESULT_BYTES} bytes"
    try:
        doc = loads_bounded(raw)
    except ValueError as err:  # a BoundError too: nested too deep to parse
        return None, f"it is not JSON: {err}"
    cost = doc.get("cost_usd") if isinstance(doc, dict) else None
    if cost is None:
        return None, None if isinstance(doc, dict) else "it is not a JSON object"
    if (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not math.isfinite(cost)
        or cost < 0
    ):
        return None, f"cost_usd must be a finite number ≥ 0, got {cost!r}"
    if cost > MAX_USD:
        return None, f"cost_usd must be at most {MAX_USD:.0f}, got {cost!r}"
    return float(cost), None


def with_reported_cost(result: AttemptResult, attempt_dir: Path) -> AttemptResult:
    """The shim's result with the cost the job reported in its result file, if any, and what
    the attempt's helper (a Ray job's watcher, a notebook's runner) said of its end."""
    cost, problem = reported_cost(attempt_dir / RESULT_FILE)
    if problem is not None:
        log.warning(
            "%s/%s: %s; the attempt's cost is not counted", attempt_dir, RESULT_FILE, problem
        )
    result = result if cost is None else replace(result, cost_usd=cost)
    return with_note(result, attempt_dir)


def with_note(result: AttemptResult, attempt_dir: Path) -> AttemptResult:
    """A failed attempt's error and fault as its helper wrote them (workers/notes.py). A stop
    on request stays a stop; a timeout keeps its own words first."""
    note = read_note(attempt_dir)
    if note is None or result.succeeded or result.outcome is Outcome.CANCELLED:
        return result
    error, fault = note
    if result.outcome is Outcome.TIMED_OUT:
        return replace(result, error=f"{result.error}; {error}" if result.error else error)
    return replace(result, error=error, fault=Fault(fault))


class ShimAttempt:
    """An attempt supervised through its shim; shared by every argv-based worker."""

    def __init__(self, proc: ShimProcess) -> None:
        self.proc = proc

    @property
    def ref(self) -> AttemptRef:
        return AttemptRef.local(self.proc.pid)

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

    def check(self, now: float) -> None:
        self.proc.check(now)

    def survivors(self) -> list[int]:
        found = {*self.proc.leftovers, *survivors(self.proc.attempt_dir)}
        found.discard(self.proc.pid)  # the shim itself, caught on its way out
        return sorted(found)


def survivors(attempt_dir: Path) -> list[int]:
    """Processes of the attempt (by its marker) that outlived its shim's stop: ghosts. They are
    stopped here (`process.sweep`); the list says who they were."""
    found = process.attempt_processes(attempt_dir)
    if found:
        process.sweep(attempt_dir)
    return found


def vanished(
    attempt_dir: Path, why: str = "process vanished while the engine was down"
) -> AttemptResult:
    """An attempt whose shim died without a result while no engine watched (or that never
    started): whatever of it is still alive is stopped first, so that it is never declared
    lost, and retried, while something of it runs."""
    swept = process.sweep(attempt_dir)
    return AttemptResult(
        outcome=Outcome.LOST,
        fault=Fault.WORKER,
        error=why
        + (f": {swept} process(es) of the attempt stopped by the engine" if swept else ""),
    )


class RayRun:
    """An attempt on a Ray environment (workers/raywatch.py): its result carries the cost the
    job reported, like a command's."""

    def __init__(self, attempt: raywatch.RayAttempt) -> None:
        self.attempt = attempt

    @property
    def ref(self) -> AttemptRef:
        return self.attempt.ref

    async def wait(self) -> AttemptResult:
        result = await self.attempt.wait()
        return with_reported_cost(result, self.attempt.spec.attempt_dir)

    def stop(self, *, now_kill: bool = False) -> None:
        self.attempt.stop(now_kill=now_kill)

    def check(self, now: float) -> None:
        self.attempt.check(now)

    def survivors(self) -> list[int]:
        return self.attempt.survivors()


class CommandAttempt(ShimAttempt):
    """A command's attempt: its result carries the cost the job reported."""

    async def wait(self) -> AttemptResult:
        return with_reported_cost(await super().wait(), self.proc.attempt_dir)


def job_env(job: Job, base: Mapping[str, str] | None = None) -> dict[str, str]:
    src = os.environ if base is None else base
    env = {k: src[k] for k in BASE_ENV_KEYS if k in src}
    env.update(job.env)
    env["CORRAL_JOB_ID"] = job.id
    env["CORRAL_ATTEMPT"] = str(job.attempts)
    return env


class CommandWorker:
    """Runs `job.command`; also serves operator-defined kinds (`workers.K.adapter: command`)."""

    def __init__(
        self,
        validate: Callable[[Permit], None],
        kind: str = "command",
        launch: Launch | None = None,
    ) -> None:
        self._validate = validate
        self.kind = kind
        self.launch = launch or Launch()

    def argv(self, job: Job) -> list[str]:
        return list(job.command)

    def ready(self) -> None:
        """Nothing to check before a command starts."""

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> CommandAttempt | RayRun:
        self._validate(permit)  # no process without a live permit, whoever calls
        attempt_dir = Path(attempt.dir)
        job, output = self.launch.prepare(job)
        env = {
            **job_env(job.with_(attempts=attempt.index)),
            "CORRAL_WORKER": self.kind,
            RESULT_ENV: str(attempt_dir.resolve() / RESULT_FILE),
        }
        if "training" in job.options.extra:  # names only: the runner moves them to a file
            env[SECRET_NAMES_ENV] = ",".join(job.options.secret_env)
        argv, remote = self.argv(job), self._ray_env(job)
        if remote is not None:  # a Ray environment: its watcher runs the attempt as a Ray job
            own = set(job.env) | {"CORRAL_JOB_ID", "CORRAL_ATTEMPT", "CORRAL_WORKER", RESULT_ENV}
            own |= {SECRET_NAMES_ENV} & set(env)
            spec = self._ray_spec(remote, job, attempt, output)
            spec.command, spec.cwd = argv, job.cwd or os.getcwd()
            attempt_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # its logs, its files
            spec.env = {k: env[k] for k in sorted(own)}
            spec.deadline_at, spec.grace_s = permit.deadline_at, max(1.0, permit.grace_s - 1.0)
            return RayRun(self._ray_watcher(remote).run(spec))
        proc = process.spawn(
            attempt_dir=attempt_dir,
            argv=argv,
            cwd=job.cwd,
            env=env,
            grace_s=permit.grace_s,
            deadline_epoch_s=permit.deadline_at,
            output=output,
            via=self.launch.zygote,
        )
        return CommandAttempt(proc)

    def _ray_spec(
        self, remote: EnvSpec, job: Job, attempt: Attempt, output: Output
    ) -> raywatch.Spec:
        token = rayauth.token(remote, self.launch.environ)
        return raywatch.Spec(
            sid=rayjob.submission_id(job.id, attempt.index),
            attempt_dir=Path(attempt.dir),
            resources=remote.resources,
            runtime_env=remote.runtime_env,
            token=token,  # sent to the job server only, and redacted from the job's log
            secrets=(*output.secrets, token) if token else output.secrets,
            max_bytes=output.max_bytes,
            tail_bytes=output.tail_bytes,
        )

    def _ray_watcher(self, remote: EnvSpec) -> raywatch.RayWatcher:
        assert remote.address is not None  # the configuration refuses a ray env without one
        return raywatch.watcher(remote.name, remote.address)

    def _ray_env(self, job: Job) -> EnvSpec | None:
        settings = self.launch.settings
        env = settings.environments.get(job.env_name) if settings is not None else None
        return env if env is not None and env.kind == "ray" else None

    def adopt(self, job: Job, attempt: Attempt) -> CommandAttempt | RayRun | AttemptResult:
        found = process.probe(Path(attempt.dir))
        if found.state == "running" and found.process is not None:
            found.process.deadline_at = attempt.deadline_at
            found.process.grace_s = job.limits.grace_s
            return CommandAttempt(found.process)
        if found.state == "finished" and found.result is not None:
            return with_reported_cost(to_result(found.result), Path(attempt.dir))
        remote = self._ray_env(job)
        if remote is not None and remote.address is not None:
            # No process of its own: its environment's watcher follows the Ray job again by
            # its submission id (lost and retried when Ray does not know it)
            revealed, output = self.launch.prepare(job)
            try:
                spec = self._ray_spec(remote, revealed, attempt, output)
            except WorkerMisconfigured as err:
                return AttemptResult(outcome=Outcome.LOST, fault=Fault.CONFIG, error=str(err))
            spec.adopted = True
            spec.deadline_at, spec.grace_s = attempt.deadline_at, job.limits.grace_s
            return RayRun(self._ray_watcher(remote).run(spec))
        if found.state == "vanished":
            return vanished(Path(attempt.dir))
        return vanished(Path(attempt.dir), "engine stopped before the process started")
