"""The `corral` command. Every command reads the configuration, talks to the store (and pokes a
running engine through its local socket), prints tables for people or `--json` for scripts, and
turns every CorralError into one line on stderr with a distinct exit code."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import typer

from corral import __version__
from corral.config import Config, load
from corral.core.ports import JobQuery, Store
from corral.domain import bounds
from corral.domain.errors import CorralError, InvalidRequest, NotPermitted
from corral.domain.models import Job, JobOptions, JobSpec, Limits, SubmitResult
from corral.domain.states import DedupMode, JobState
from corral.runtime.assembly import build_store, submissions
from corral.runtime.control import caller_job, operator_only, poke
from corral.runtime.published import active_config
from corral.scheduler.service import Submissions
from corral.workers import privacy

from . import configs, governance, guard, mechanism, policy_cmds, schema_cmd, views
from .exits import exit_code, fail
from .options import ConfigOpt, DataDir, FollowOpt, JsonOpt, NoEngineOkOpt, QuietOpt
from .waiting import Follow, mode_for

if TYPE_CHECKING:
    from corral.runtime.engine import Engine

T = TypeVar("T")

app = typer.Typer(
    name="corral", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Corral keeps AI agents bounded: it queues jobs, grants each attempt a permit, "
         "stops, retries and records them.")
dlq_app = typer.Typer(no_args_is_help=True, help="The dead-letter queue: jobs whose retries ran "
                                                 "out. Inspect, requeue with a fresh budget, "
                                                 "or purge.")
app.add_typer(dlq_app, name="dlq")


# How `submit --wait` reports a job's end (documented in docs/reference/cli.md).
WAIT_EXIT = {JobState.TIMED_OUT: 124, JobState.CANCELLED: 130, JobState.KILLED: 137,
             JobState.DENIED: 77}


def _config(data_dir: Path | None, config: Path | None) -> Config:
    cfg = load(data_dir=data_dir, config_path=config)
    # Private from its first file on, whichever command creates it (workers/privacy.py).
    warning = privacy.secure_data_dir(cfg.data_dir)
    if warning:
        typer.echo(f"corral: warning: {warning}", err=True)
    return cfg


def with_store(cfg: Config, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run one coroutine against it, close it; errors become one line."""

    async def main() -> T:
        store = build_store(cfg)
        await store.open()
        try:
            return await fn(store)
        finally:
            await store.close()

    try:
        return anyio.run(main)
    except CorralError as err:
        fail(err)


def _emit(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"--setenv wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


@app.command()
def version(as_json: JsonOpt = False) -> None:
    """Print Corral's version."""
    if as_json:
        _emit({"version": __version__})
    else:
        typer.echo(__version__)


@app.command()
def serve(data_dir: DataDir = None, config: ConfigOpt = None,
          drain: Annotated[bool, typer.Option(
              "--drain", help="Exit once nothing is queued, waiting or running.")] = False,
          verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the engine on this data directory until SIGTERM/SIGINT.

    Attempts run in their own sessions: stopping (or crashing) the engine leaves them running,
    and the next engine on the same data directory re-adopts them and collects their results.
    """
    from corral.runtime.engine import Engine  # the engine's machinery: only `serve` needs it

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = _config(data_dir, config)
        engine = Engine(cfg)

        def ready(e: Engine) -> None:
            typer.echo(f"corral engine {e.id} serving {cfg.data_dir} (pid {os.getpid()})", err=True)

        anyio.run(lambda: engine.run(drain=drain, on_ready=ready))
    except CorralError as err:
        fail(err)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command("core")
def core_cmd(data_dir: DataDir = None, config: ConfigOpt = None) -> None:
    """Run the core alone, speaking JSON Lines on stdin/stdout (docs/reference/core-protocol.md).

    `corral serve` starts and supervises one of these; another scheduler may drive one too.
    """
    from corral.runtime.coreproc import main as core_main

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    core_main(_config_or_fail(data_dir, config))



@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    command: Annotated[list[str] | None, typer.Argument(
        help="The program and its arguments, after `--`.", show_default=False)] = None,
    role: Annotated[str | None, typer.Option("--role", "-r", help="Role from corral.yaml.")]
    = None,
    priority: Annotated[int, typer.Option("--priority", "-p",
                                          help="0 critical … 4 backlog.")] = 2,
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key.")] = None,
    dedup: Annotated[DedupMode, typer.Option("--dedup", help="What a held key does.")]
    = DedupMode.COALESCE,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds per attempt (max_duration_s).")] = None,
    grace: Annotated[float | None, typer.Option(
        "--grace", help="Seconds between SIGTERM and SIGKILL.")] = None,
    max_attempts: Annotated[int | None, typer.Option(
        "--max-attempts", help="Total tries, first included.")] = None,
    env_name: Annotated[str | None, typer.Option("--env", help="Environment to run in.")] = None,
    after: Annotated[list[str] | None, typer.Option(
        "--after", help="Run only after this job succeeded (repeatable).")] = None,
    cwd: Annotated[Path | None, typer.Option("--cwd", help="Working directory.")] = None,
    setenv: Annotated[list[str] | None, typer.Option(
        "--setenv", "-e", help="NAME=VALUE for the job's environment (repeatable).")] = None,
    tenant: Annotated[str, typer.Option("--tenant")] = "default",
    worker: Annotated[str | None, typer.Option(
        "--worker", help="Worker kind (default: the role's, for commands `command`).")] = None,
    parent: Annotated[str | None, typer.Option(
        "--parent", envvar="CORRAL_JOB_ID", show_envvar=False,
        help="The job submitting this one (set automatically inside a job): the child is one "
             "level deeper, bounded by the role's max_recursion_depth.")] = None,
    workspace: Annotated[Path | None, typer.Option(
        "--workspace", help="Directory this job edits; jobs on one workspace follow the "
        "role's workspace_policy (reject, coalesce or serialize).")] = None,
    prompt: Annotated[str | None, typer.Option(
        "--prompt", help="The task for an agent worker (claude-code, codex, opencode).")] = None,
    prompt_file: Annotated[str | None, typer.Option(
        "--prompt-file", metavar="PATH",
        help="Read the prompt from this file (`-`: standard input), for prompts too long "
             "for the command line.")] = None,
    resume_from: Annotated[str | None, typer.Option(
        "--resume-from", help="Continue this earlier agent job's session (same worker kind).")]
    = None,
    max_tool_calls: Annotated[int | None, typer.Option(
        "--max-tool-calls", help="Tool calls an agent attempt may make.")] = None,
    token_budget_in: Annotated[int | None, typer.Option(
        "--token-budget-in", help="Input tokens an agent attempt may use.")] = None,
    token_budget_out: Annotated[int | None, typer.Option(
        "--token-budget-out", help="Output tokens an agent attempt may use.")] = None,
    secret_env: Annotated[list[str] | None, typer.Option(
        "--secret-env", help="NAME of a variable the job gets as a secret: the value given "
        "with --setenv NAME=VALUE, else the engine's own NAME. Its value is never stored in "
        "clear and is redacted from logs, traces and output (repeatable).")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow the job and exit with its exit code; on a terminal a status "
                       "line says why it waits.")] = False,
    follow_output: FollowOpt = False, quiet: QuietOpt = False,
    no_engine_ok: NoEngineOkOpt = False,
    as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None,
) -> None:
    """Queue a job and print its id.

    Examples: corral submit --role default -- make test;
    corral submit --role notebook --prompt "Check the nightly training job"
    """
    if prompt_file is not None:
        if prompt is not None:
            fail(InvalidRequest("give the prompt once: --prompt or --prompt-file, not both"))
        prompt = _read_prompt(prompt_file)
    cfg = _config_or_fail(data_dir, config)
    argv = tuple(command or ())

    def make(active: Config) -> JobSpec:
        """The spec, with the defaults of the configuration the engine runs."""
        s = active.settings
        role_name = role if role is not None else s.default_role
        role_spec = s.roles.get(role_name)
        base = role_spec.limits if role_spec else Limits()
        limits = Limits(
            max_attempts=max_attempts if max_attempts is not None else base.max_attempts,
            timeout_s=timeout if timeout is not None else base.timeout_s,
            grace_s=grace if grace is not None else base.grace_s,
            max_tool_calls=_or(max_tool_calls, base.max_tool_calls),
            token_budget_in=_or(token_budget_in, base.token_budget_in),
            token_budget_out=_or(token_budget_out, base.token_budget_out))
        options = JobOptions(resume_from=resume_from or None,
                             secret_env=tuple(sorted(set(secret_env or ()))))
        return JobSpec(command=argv, prompt=prompt, options=options, role=role_name,
                       env_name=env_name if env_name is not None else s.default_env,
                       priority=priority, tenant=tenant, key=key, dedup=dedup, limits=limits,
                       after=tuple(after or ()),
                       cwd=str(cwd.expanduser().resolve()) if cwd else str(Path.cwd()),
                       env=_parse_env(setenv or []), worker=worker, parent_id=parent,
                       workspace=str(workspace.expanduser().resolve()) if workspace else None)

    result, serving = with_store(cfg, lambda st: _submit(st, cfg, make, quiet=quiet))
    if as_json:
        _emit({"id": result.job.id, "created": result.created,
               "coalesced_on": result.coalesced_on, "superseded": result.superseded,
               "state": result.job.state.value, "engine_serving": serving})
    else:
        typer.echo(result.job.id)
        if not result.created and not quiet:
            on = (f"workspace {result.job.workspace}" if result.coalesced_on == "workspace"
                  else f"key {key!r}")
            typer.echo(f"corral: coalesced into existing job {result.job.id} ({on})", err=True)
    wait = wait or follow_output
    if not serving and not wait and not quiet and not as_json and not result.job.state.terminal:
        typer.echo(f"corral: no engine is serving {cfg.data_dir}: the job waits in the queue "
                   "until `corral serve` runs there", err=True)
    if wait:
        how = Follow(mode=mode_for(quiet=quiet or as_json), output=follow_output,
                     no_engine_ok=no_engine_ok)
        raise typer.Exit(_follow(cfg, result.job.id, how)[0])


async def _submit(st: Store, local: Config, make: Callable[[Config], JobSpec], *,
                  quiet: bool) -> tuple[SubmitResult, bool]:
    """Submit against the engine's configuration, poke the engine, and say whether one serves
    the data directory."""
    from corral.runtime.watch import engine_serving

    svc, cfg = await active_submissions(st, local, quiet=quiet)
    result = await svc.submit(make(cfg))
    poke(cfg.data_dir, "submitted")
    return result, await engine_serving(cfg, st, time.time())


async def active_submissions(st: Store, local: Config, *,
                             quiet: bool = False) -> tuple[Submissions, Config]:
    """The submission service over the configuration the engine runs (runtime/published.py);
    a note on stderr when the local file is not that one."""
    cfg, note = await active_config(st, local)
    if note and not quiet:
        typer.echo(f"corral: note: {note}", err=True)
    return submissions(st, cfg), cfg


def _read_prompt(path: str) -> str:
    """The prompt in a file, or on standard input for `-`: UTF-8 text within the prompt bound
    (domain/bounds.py); a one-line error otherwise."""
    limit = bounds.MAX_PROMPT_BYTES
    where = "standard input" if path == "-" else path
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(limit + 1)
    except OSError as err:
        fail(InvalidRequest(f"--prompt-file: cannot read {where}: {err.strerror or err}"))
    if len(raw) > limit:
        fail(InvalidRequest(f"--prompt-file: {where} is over the {limit}-byte prompt limit"))
    try:
        return raw.decode()
    except UnicodeDecodeError:
        fail(InvalidRequest(f"--prompt-file: {where} is not UTF-8 text"))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _config_or_fail(data_dir: Path | None, config: Path | None) -> Config:
    try:
        return _config(data_dir, config)
    except CorralError as err:
        fail(err)


def exit_code_of(job: Job) -> int:
    """The exit code `submit --wait` and `wait` report for a job that ended."""
    if job.state is JobState.SUCCEEDED:
        return 0
    if job.state in WAIT_EXIT:
        return WAIT_EXIT[job.state]
    return job.exit_code if job.exit_code not in (None, 0) else 1


def _follow(cfg: Config, ref: str, how: Follow) -> tuple[int, Job]:
    """Follow the job (cli/waiting.py); the exit code `submit --wait` and `wait` give, and the
    job as last seen."""
    from corral.cli.waiting import follow

    try:
        job, done = with_store(cfg, lambda st: follow(cfg, st, ref, how))
    except KeyboardInterrupt:
        typer.echo(f"corral: stopped following {ref}; the job goes on (corral wait {ref})",
                   err=True)
        raise typer.Exit(130) from None
    if done is None:
        typer.echo(f"corral: {job.id} is still {job.state.value} after {how.timeout}s", err=True)
        return 124, job
    return (exit_code_of(job) if job.state.terminal else 0), job


@app.command("wait")
def wait_cmd(job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
             until: Annotated[str, typer.Option(
                 "--for", help="`end` (default) or `running`.")] = "end",
             timeout: Annotated[float | None, typer.Option(
                 "--timeout", help="Give up after this many seconds (exit 124).")] = None,
             follow_output: FollowOpt = False, quiet: QuietOpt = False,
             no_engine_ok: NoEngineOkOpt = False,
             as_json: Annotated[bool, typer.Option(
                 "--json", help="Then print the job as JSON (as `show --json` without its "
                                "timeline); no status on the way.")] = False,
             data_dir: DataDir = None, config: ConfigOpt = None) -> None:
    """Block until a job ends (exit with its exit code, as `submit --wait`) or starts running.

    On a terminal a status line says why the job waits (queued behind N, an open breaker and
    until when, a pause, an approval, no engine); elsewhere a line on stderr when something
    holds it back. It fails at once (exit 7) when no engine serves the data directory.
    """
    if until not in ("end", "running"):
        fail(InvalidRequest(f"--for must be `end` or `running`, got {until!r}"))
    if timeout is not None:  # a one-line error (exit 2) from main()
        bounds.number("--timeout", timeout, low=0, high=bounds.MAX_EXPIRES_S, unit="seconds")
    cfg = _config_or_fail(data_dir, config)
    how = Follow(until=until, timeout=timeout, mode=mode_for(quiet=quiet or as_json),
                 output=follow_output, no_engine_ok=no_engine_ok)
    code, seen = _follow(cfg, job, how)
    if as_json:
        _emit(views.job_json(with_store(cfg, lambda st: st.get_job(seen.id))))
    raise typer.Exit(code)


@app.command()
def jobs(
    state: Annotated[JobState | None, typer.Option("--state", "-s", case_sensitive=False)]
    = None,
    role: Annotated[str | None, typer.Option("--role", "-r")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
    as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None,
) -> None:
    """List jobs, newest first."""
    cfg = _config_or_fail(data_dir, config)
    query = JobQuery(state=state, role=role, limit=limit)
    if as_json:
        _emit([views.job_json(j) for j in with_store(cfg, lambda st: st.list_jobs(query))])
    else:
        found, short = with_store(cfg, lambda st: _with_short_ids(st, query))
        views.print_jobs(found, short=short)


async def _with_short_ids(st: Store, query: JobQuery) -> tuple[list[Job], dict[str, str]]:
    found = await st.list_jobs(query)
    return found, await st.short_ids([j.id for j in found])


@app.command()
def show(job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
         as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None) -> None:
    """A job: its fields, its attempts and its timeline."""
    cfg = _config_or_fail(data_dir, config)

    async def fetch(st: Store) -> tuple[Any, Any, Any, Any]:
        j = await st.get_job(job)
        return j, await st.attempts(j.id), await st.events(j.id), await st.agent_events(j.id)

    j, attempts, events, agent = with_store(cfg, fetch)
    if as_json:
        data = views.job_json(j, detail=True)
        data["attempts"] = [views.attempt_json(a) for a in attempts]
        data["timeline"] = [views.event_json(e) for _, e in events]
        data["agent_events"] = [views.agent_event_json(e) for e in agent]
        _emit(data)
    else:
        views.print_job(j, attempts, [e for _, e in events])
        views.print_agent_events(agent)


@app.command()
def trace(job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
          as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None) -> None:
    """An agent job's traces: per attempt, every tool call (input, output, duration, denied or
    not and why), tokens, cost, checkpoints and the policy decisions taken on the way."""
    cfg = _config_or_fail(data_dir, config)

    async def fetch(st: Store) -> tuple[Any, Any, Any]:
        j = await st.get_job(job)
        return j, await st.agent_events(j.id), await st.policy_evaluations(j.id)

    j, agent, evaluations = with_store(cfg, fetch)
    if as_json:
        _emit({"job": j.id, "state": j.state.value, "worker": j.worker,
               "agent_events": [views.agent_event_json(e) for e in agent],
               "policy_evaluations": [views.evaluation_json(e) for e in evaluations]})
        return
    if not agent and not evaluations:
        typer.echo(f"job {j.id} ({j.worker}, {j.state.value}) has no agent trace yet"
                   + ("" if j.state.terminal else ": attempts write theirs when they end"))
        return
    typer.echo(f"job {j.id}  {j.state.value}  {j.worker}  role {j.role}")
    views.print_agent_events(agent, full=True)
    pending = [e for e in evaluations if e.attempt not in {a.attempt for a in agent}]
    if pending:
        typer.echo(f"running attempt: {len(pending)} policy decisions so far")
        for e in pending[-20:]:
            typer.echo(f"  {views.short_time(e.at)}  {e.verdict:<5}  {e.subject:<10} {e.reason}")


@app.command()
def logs(job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
         follow: Annotated[bool, typer.Option("--follow", "-f",
                                              help="Keep printing until the job ends.")] = False,
         attempt: Annotated[int | None, typer.Option(
             "--attempt", help="Only this attempt (default: all).")] = None,
         data_dir: DataDir = None, config: ConfigOpt = None) -> None:
    """Print a job's stdout (to stdout) and stderr (to stderr), attempt by attempt."""
    from corral.cli.logs import stream_logs

    cfg = _config_or_fail(data_dir, config)
    try:
        anyio.run(lambda: stream_logs(build_store(cfg), job, follow=follow, only=attempt))
    except CorralError as err:
        fail(err)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command()
def cancel(job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
           reason: Annotated[str, typer.Option("--reason", help="Recorded on the job.")]
           = "cancelled by operator",
           as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None) -> None:
    """Cancel a queued or running job, and every job it submitted (unless their role is
    `detached`). The request is stored first, then the engine stops each attempt's whole
    process tree (SIGTERM, grace, SIGKILL)."""
    cfg = _config_or_fail(data_dir, config)
    j = with_store(cfg, lambda st: _cancel(st, cfg, job, reason, caller_job(cfg.data_dir)))
    answered = poke(cfg.data_dir) is not None
    if as_json:
        _emit({"id": j.id, "state": j.state.value, "cancel_requested": j.cancel_requested})
        return
    if j.state.terminal:
        typer.echo(f"{j.id} {j.state.value}")
    else:
        typer.echo(f"{j.id} cancel requested; " + (
            "the engine is stopping it" if answered
            else "no engine is running: it will be stopped when one starts"))


async def _cancel(st: Store, cfg: Config, ref: str, reason: str, caller: str | None) -> Job:
    """Cancel a job; one of the engine's jobs (`caller`) may cancel itself and the jobs it
    submitted (its descendants), not anyone else's: NotPermitted."""
    if caller is not None:
        target = await st.get_job(ref)
        seen, cursor = set(), target
        while cursor.id != caller and cursor.parent_id and cursor.id not in seen:
            seen.add(cursor.id)
            cursor = await st.get_job(cursor.parent_id)
        if cursor.id != caller:
            raise NotPermitted(f"refused: job {caller} may cancel itself and the jobs it "
                               f"submitted, not job {target.id}")
    return await submissions(st, cfg).cancel(ref, reason)


@app.command()
def workspaces(as_json: JsonOpt = False, data_dir: DataDir = None,
               config: ConfigOpt = None) -> None:
    """Workspaces locked by a job, and since when."""
    cfg = _config_or_fail(data_dir, config)
    held = with_store(cfg, lambda st: st.workspaces())
    if as_json:
        _emit([{"workspace": w, "job": j, "acquired_at": views.ts(t)} for w, j, t in held])
    elif not held:
        typer.echo("no workspace is locked")
    else:
        for w, j, t in held:
            typer.echo(f"{w}  held by {j} since {views.short_time(t)}")


@app.command()
def events(kind: Annotated[str | None, typer.Option(
               "--kind", help="breaker, defense, escalation or permit (default: all).")] = None,
           limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
           as_json: JsonOpt = False, data_dir: DataDir = None,
           config: ConfigOpt = None) -> None:
    """The core's recorded decisions: breaker transitions, defense stages, escalations."""
    cfg = _config_or_fail(data_dir, config)
    found = with_store(cfg, lambda st: st.core_events(kind=kind, limit=limit))
    if as_json:
        _emit(found)
        return
    if not found:
        typer.echo("no core events recorded")
    for e in found:
        typer.echo(f"{views.short_time(e['at'])}  {e['kind']:<10} {views.event_subject(e)} "
                   f"→ {e['state']}  {e['reason']}  {e['message']}")


@dlq_app.command("list")
def dlq_list(limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
             as_json: JsonOpt = False, data_dir: DataDir = None,
             config: ConfigOpt = None) -> None:
    """Dead-lettered jobs not yet requeued or purged."""
    cfg = _config_or_fail(data_dir, config)
    query = JobQuery(dead_lettered_unresolved=True, limit=limit)
    if as_json:
        _emit([views.job_json(j) for j in with_store(cfg, lambda st: st.list_jobs(query))])
    else:
        found, short = with_store(cfg, lambda st: _with_short_ids(st, query))
        views.print_jobs(found, title="dead-letter queue", short=short)


@dlq_app.command("show")
def dlq_show(job: str, as_json: JsonOpt = False, data_dir: DataDir = None,
             config: ConfigOpt = None) -> None:
    """A dead-lettered job with its attempts and last error."""
    show(job, as_json=as_json, data_dir=data_dir, config=config)


@dlq_app.command("requeue")
def dlq_requeue(job: str, as_json: JsonOpt = False, data_dir: DataDir = None,
                config: ConfigOpt = None) -> None:
    """Submit a fresh copy of a dead-lettered job with a fresh attempt budget (recorded on both)."""
    cfg = _config_or_fail(data_dir, config)
    operator_only(cfg.data_dir, "dlq requeue")
    async def requeue(st: Store) -> Job:
        return await (await active_submissions(st, cfg))[0].dlq_requeue(job)

    new = with_store(cfg, requeue)
    poke(cfg.data_dir)
    if as_json:
        _emit({"id": new.id, "requeued_from": new.requeued_from, "state": new.state.value})
    else:
        typer.echo(new.id)


@dlq_app.command("purge")
def dlq_purge(jobs_: Annotated[list[str] | None, typer.Argument(
                  metavar="JOB...", help="Jobs to purge.", show_default=False)] = None,
              all_: Annotated[bool, typer.Option("--all", help="Purge every listed job.")]
              = False,
              as_json: JsonOpt = False, data_dir: DataDir = None,
              config: ConfigOpt = None) -> None:
    """Drop jobs from the dead-letter queue. Their records, attempts and logs stay."""
    cfg = _config_or_fail(data_dir, config)
    operator_only(cfg.data_dir, "dlq purge")
    if not jobs_ and not all_:
        fail(InvalidRequest("name the jobs to purge, or pass --all"))

    async def purge(st: Store) -> list[str]:
        refs = list(jobs_ or [])
        if all_:
            refs += [j.id for j in await st.list_jobs(
                JobQuery(dead_lettered_unresolved=True, limit=1_000_000))]
        svc = submissions(st, cfg)
        return [(await svc.dlq_purge(r)).id for r in dict.fromkeys(refs)]

    done = with_store(cfg, purge)
    if as_json:
        _emit({"purged": done})
    else:
        typer.echo(f"purged {len(done)} job(s)")


@app.command()
def demo(data_dir: Annotated[Path | None, typer.Option(
             "--data-dir", help="Where the demo engine keeps its state, kept afterwards "
             "(default: a fresh temporary directory, removed at the end unless --keep).")]
         = None,
         keep: Annotated[bool, typer.Option(
             "--keep", help="Keep the temporary directory for inspection.")] = False) -> None:
    """Start an engine and govern a small demo fleet live: retries into the dead-letter queue,
    a timeout, a cancel, a deduplicated submission, a dependency chain."""
    from corral.cli.demo import run_demo

    try:
        raise typer.Exit(run_demo(data_dir, keep=keep))
    except CorralError as err:
        fail(err)


def _data_dir_of(data_dir: Path | None) -> Path:
    return _config_or_fail(data_dir, None).data_dir


mechanism.register(app, _data_dir_of)
governance.register(app, _config_or_fail, with_store, _emit)
configs.register(app, _config_or_fail, with_store, _emit)
policy_cmds.register(app, _config_or_fail, with_store, _emit)
app.add_typer(guard.app, name="guard")
schema_cmd.register(app)


def main() -> None:
    """Entry point of the `corral` command."""
    privacy.make_private()  # every file Corral creates is its user's alone, whatever the umask
    try:
        code = app(standalone_mode=False)  # returns the code of a `typer.Exit`
        sys.exit(code if isinstance(code, int) else 0)
    except CorralError as err:  # anything a command did not catch itself
        typer.echo(f"corral: error: {err}", err=True)
        sys.exit(exit_code(err))
    except typer.Abort:
        typer.echo("corral: aborted", err=True)
        sys.exit(1)
    except typer.TyperException as err:  # a usage error: one line, like every other error
        if type(err).__name__ == "NoArgsIsHelpError":  # `corral budget`: the group's help
            typer.echo(err.format_message(), err=True)
        else:
            typer.echo(f"corral: error: {_usage_line(err)}", err=True)
        sys.exit(getattr(err, "exit_code", 2))
    except Exception as err:  # a bug: still one line, the traceback on request
        if os.environ.get("CORRAL_DEBUG"):
            raise
        typer.echo(f"corral: internal error: {type(err).__name__}: {err} "
                   "(set CORRAL_DEBUG=1 for the traceback)", err=True)
        sys.exit(70)


def _usage_line(err: Exception) -> str:
    """`No such option: --usd` → `no such option: --usd (see `corral budget set --help`)`."""
    message = getattr(err, "format_message", lambda: str(err))()
    message = message[:1].lower() + message[1:].rstrip(".")
    ctx = getattr(err, "ctx", None)
    return message if ctx is None else f"{message} (see `{ctx.command_path} --help`)"
