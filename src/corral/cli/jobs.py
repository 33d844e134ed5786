"""The job commands: `corral submit`, `wait`, `jobs`, `show`, `trace`, `logs`, `cancel`,
`workspaces`, `events`. Each one parses its options, calls one service (services/) and
renders the answer (cli/views.py)."""

from __future__ import annotations

import dataclasses
import getpass
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral.core.jobquery import JobQuery
from corral.domain import bounds
from corral.domain.errors import InvalidRequest
from corral.domain.models import Job
from corral.domain.states import DedupMode, JobState

from . import views
from .edge import config_or_fail, emit, note, peek_jobs, remote_url, waker, with_store
from .exits import fail
from .options import ConfigOpt, DataDir, FollowOpt, JsonOpt, NoEngineOkOpt, QuietOpt

if TYPE_CHECKING:
    from corral.config import Config
    from corral.runtime import control
    from corral.schemas import views as schemas
    from corral.services import cancellation, notebooks, queries, runs, submissions
    from corral.services import training as trainings

    from . import waiting
else:  # each imported when a command first uses it (`corral jobs` needs queries only)
    from .lazy import lazy_module

    control = lazy_module("corral.runtime.control")
    cancellation = lazy_module("corral.services.cancellation")
    notebooks = lazy_module("corral.services.notebooks")
    queries = lazy_module("corral.services.queries")
    runs = lazy_module("corral.services.runs")
    schemas = lazy_module("corral.schemas.views")
    trainings = lazy_module("corral.services.training")
    submissions = lazy_module("corral.services.submissions")
    waiting = lazy_module("corral.cli.waiting")

# How `submit --wait` reports a job's end (documented in docs/reference/cli.md).
WAIT_EXIT = {
    JobState.TIMED_OUT: 124,
    JobState.CANCELLED: 130,
    JobState.KILLED: 137,
    JobState.DENIED: 77,
}

JobArg = Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")]


def register(app: typer.Typer) -> None:
    """Add the job commands to the `corral` app."""
    app.command(context_settings={"allow_interspersed_args": False})(submit)
    app.command("wait")(wait_cmd)
    for command in (jobs, show, trace, logs, cancel, workspaces):  # events: cli/events.py
        app.command()(command)


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"--setenv wants NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def submit(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program and its arguments, after `--`.", show_default=False),
    ] = None,
    role: Annotated[str | None, typer.Option("--role", "-r", help="Role from corral.yaml.")] = None,
    priority: Annotated[int, typer.Option("--priority", "-p", help="0 critical … 4 backlog.")] = 2,
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key.")] = None,
    dedup: Annotated[
        DedupMode, typer.Option("--dedup", help="What a held key does.")
    ] = DedupMode.COALESCE,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds per attempt (max_duration_s).")
    ] = None,
    grace: Annotated[
        float | None, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option("--max-attempts", help="Total tries, first included.")
    ] = None,
    env_name: Annotated[str | None, typer.Option("--env", help="Environment to run in.")] = None,
    after: Annotated[
        list[str] | None,
        typer.Option("--after", help="Run only after this job succeeded (repeatable)."),
    ] = None,
    cwd: Annotated[Path | None, typer.Option("--cwd", help="Working directory.")] = None,
    setenv: Annotated[
        list[str] | None,
        typer.Option("--setenv", "-e", help="NAME=VALUE for the job's environment (repeatable)."),
    ] = None,
    tenant: Annotated[str, typer.Option("--tenant")] = "default",
    worker: Annotated[
        str | None,
        typer.Option("--worker", help="Worker kind (default: the role's, for commands `command`)."),
    ] = None,
    parent: Annotated[
        str | None,
        typer.Option(
            "--parent",
            envvar="CORRAL_JOB_ID",
            show_envvar=False,
            help="The job submitting this one (set automatically inside a job): the child is one "
            "level deeper, bounded by the role's max_recursion_depth.",
        ),
    ] = None,
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            help="Directory this job edits; jobs on one workspace follow the "
            "role's workspace_policy (reject, coalesce or serialize).",
        ),
    ] = None,
    prompt: Annotated[
        str | None,
        typer.Option(
            "--prompt", help="The task for an agent worker (claude-code, codex, opencode)."
        ),
    ] = None,
    prompt_file: Annotated[
        str | None,
        typer.Option(
            "--prompt-file",
            metavar="PATH",
            help="Read the prompt from this file (`-`: standard input), for prompts too long "
            "for the command line.",
        ),
    ] = None,
    resume_from: Annotated[
        str | None,
        typer.Option(
            "--resume-from", help="Continue this earlier agent job's session (same worker kind)."
        ),
    ] = None,
    max_tool_calls: Annotated[
        int | None, typer.Option("--max-tool-calls", help="Tool calls an agent attempt may make.")
    ] = None,
    token_budget_in: Annotated[
        int | None, typer.Option("--token-budget-in", help="Input tokens an agent attempt may use.")
    ] = None,
    token_budget_out: Annotated[
        int | None,
        typer.Option("--token-budget-out", help="Output tokens an agent attempt may use."),
    ] = None,
    secret_env: Annotated[
        list[str] | None,
        typer.Option(
            "--secret-env",
            help="NAME of a variable the job gets as a secret: the value given "
            "with --setenv NAME=VALUE, else the engine's own NAME. Its value is never stored in "
            "clear and is redacted from logs, traces and output (repeatable).",
        ),
    ] = None,
    notebook: Annotated[
        str | None,
        typer.Option(
            "--notebook",
            metavar="PATH",
            help="Run this .ipynb with papermill (locally, or as a Ray job with --env on a "
            "ray environment) instead of a command.",
        ),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-P",
            help="NAME=VALUE for the notebook's parameters cell; VALUE is JSON when it parses "
            "as JSON, else a string (repeatable).",
        ),
    ] = None,
    copyback: Annotated[
        Path | None,
        typer.Option("--copyback", help="Copy the executed notebook here (also when it fails)."),
    ] = None,
    copyback_hook: Annotated[
        str | None,
        typer.Option(
            "--copyback-hook",
            help="A shell command run after the copy (CORRAL_NOTEBOOK, CORRAL_NOTEBOOK_SHA256).",
        ),
    ] = None,
    copyback_url: Annotated[
        str | None,
        typer.Option("--copyback-url", help="POST the copy's record (path, sha256) here."),
    ] = None,
    cell_timeout: Annotated[
        float | None,
        typer.Option("--cell-timeout", help="Seconds a notebook cell may run."),
    ] = None,
    training: Annotated[
        str | None,
        typer.Option(
            "--training",
            metavar="sft|dpo|grpo",
            help="Run --script as a training job (TRL): on a ray environment as a Ray job, with "
            "the job id, a W&B run id and a checkpoint directory in its environment; the "
            "arguments after `--` go to the script.",
        ),
    ] = None,
    script: Annotated[
        Path | None, typer.Option("--script", help="The training script (with --training).")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Passed to the script as --model.")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Passed to the script as --dataset.")
    ] = None,
    compare_to: Annotated[
        str | None,
        typer.Option(
            "--compare-to",
            metavar="JOB",
            help="Compare the run's final metrics with this training job's: a watched metric "
            "worse by more than the threshold records a metric_regression incident.",
        ),
    ] = None,
    watch: Annotated[
        list[str] | None,
        typer.Option(
            "--watch",
            help="A metric to compare (NAME, lower is better; NAME:max, higher is better; "
            "default train/loss; repeatable).",
        ),
    ] = None,
    regression_threshold: Annotated[
        float | None,
        typer.Option("--regression-threshold", help="How much worse is a regression (0.1: 10%)."),
    ] = None,
    wandb_project: Annotated[
        str | None, typer.Option("--wandb-project", help="The W&B project of the runs.")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the job and exit with its exit code; on a terminal a status "
            "line says why it waits.",
        ),
    ] = False,
    follow_output: FollowOpt = False,
    quiet: QuietOpt = False,
    no_engine_ok: NoEngineOkOpt = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Queue a job and print its id.

    Examples: corral submit --role default -- make test;
    corral submit --role notebook --prompt "Check the nightly training job";
    corral submit --notebook report.ipynb -P day=3 --env ray --copyback out/
    """
    if prompt_file is not None:
        if prompt is not None:
            fail(InvalidRequest("give the prompt once: --prompt or --prompt-file, not both"))
        prompt = _read_prompt(prompt_file)
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        local = {
            "--grace": grace is not None,
            "--parent": parent is not None and parent != os.environ.get("CORRAL_JOB_ID"),
            "--workspace": workspace is not None,
            "--secret-env": bool(secret_env),
            "--max-tool-calls": max_tool_calls is not None,
            "--token-budget-in": token_budget_in is not None,
            "--token-budget-out": token_budget_out is not None,
            "--notebook": notebook is not None,  # a path on this machine: POST an intent
            "--training": training is not None,  # the API's `training` body does it
        }
        for option, given in local.items():
            if given:
                fail(remote.local_only(option, url))
        try:
            env = _parse_env(setenv or [])
        except InvalidRequest as err:
            fail(err)
        made = remote.run(
            url,
            lambda c: c.submit(
                tuple(command or ()),
                prompt=prompt,
                role=role,
                priority=priority,
                env=env,
                timeout_s=timeout,
                max_attempts=max_attempts,
                after=tuple(after or ()),
                cwd=str(cwd) if cwd else None,
                key=key,
                env_name=env_name,
                tenant=None if tenant == "default" else tenant,
                worker=worker,
                resume_from=resume_from,
                dedup=dedup.value,
            ),
        )
        _print_submitted(
            remote.job(made.job),
            made.created,
            made.coalesced_on,
            key,
            quiet,
            as_json,
            superseded=made.superseded,
            serving=made.engine_serving,
        )
        if wait or follow_output:
            raise typer.Exit(_follow_remote(url, made.job.id, "end", None, follow_output)[0])
        return
    cfg = config_or_fail(data_dir, config)

    def request() -> (
        submissions.SubmitRequest
    ):  # after the configuration: a bad --setenv fails inside
        return _with_notebook(
            _with_training(
                plain(),
                training,
                script,
                notebook=notebook,
                model=model,
                dataset=dataset,
                compare_to=compare_to,
                watch=watch,
                threshold=regression_threshold,
                wandb_project=wandb_project,
            ),
            notebook,
            param=param,
            copyback=copyback,
            hook_command=copyback_hook,
            hook_url=copyback_url,
            cell_timeout=cell_timeout,
        )

    def plain() -> submissions.SubmitRequest:
        return submissions.SubmitRequest(
            command=tuple(command or ()),
            prompt=prompt,
            role=role,
            env_name=env_name,
            priority=priority,
            tenant=tenant,
            key=key,
            dedup=dedup,
            limits=submissions.LimitChoices(
                max_attempts=max_attempts,
                timeout_s=timeout,
                grace_s=grace,
                max_tool_calls=max_tool_calls,
                token_budget_in=token_budget_in,
                token_budget_out=token_budget_out,
            ),
            after=tuple(after or ()),
            cwd=str(cwd.expanduser().resolve()) if cwd else str(Path.cwd()),
            env=_parse_env(setenv or []),
            worker=worker,
            parent_id=parent,
            workspace=str(workspace.expanduser().resolve()) if workspace else None,
            resume_from=resume_from,
            secret_env=tuple(secret_env or ()),
            by=getpass.getuser(),
        )

    done = with_store(
        cfg, lambda st: submissions.submit(st, cfg, request(), waker(cfg), None if quiet else note)
    )
    result, serving = done.result, done.engine_serving
    _print_submitted(
        result.job,
        result.created,
        result.coalesced_on,
        key,
        quiet,
        as_json,
        superseded=result.superseded,
        serving=serving,
    )
    wait = wait or follow_output
    if not serving and not wait and not quiet and not as_json and not result.job.state.terminal:
        typer.echo(
            f"corral: no engine is serving {cfg.data_dir}: the job waits in the queue "
            "until `corral serve` runs there",
            err=True,
        )
    if wait:
        how = waiting.Follow(
            mode=waiting.mode_for(quiet=quiet or as_json),
            output=follow_output,
            no_engine_ok=no_engine_ok,
        )
        raise typer.Exit(_follow(cfg, result.job.id, how)[0])


def _print_submitted(
    job: Job,
    created: bool,
    coalesced_on: str | None,
    key: str | None,
    quiet: bool,
    as_json: bool,
    *,
    superseded: str | None,
    serving: bool,
) -> None:
    if as_json:
        emit(
            {
                "id": job.id,
                "created": created,
                "coalesced_on": coalesced_on,
                "superseded": superseded,
                "state": job.state.value,
                "engine_serving": serving,
            }
        )
        return
    typer.echo(job.id)
    if not created and not quiet:
        on = f"workspace {job.workspace}" if coalesced_on == "workspace" else f"key {key!r}"
        typer.echo(f"corral: coalesced into existing job {job.id} ({on})", err=True)


def _follow_remote(
    url: str, ref: str, until: str, timeout: float | None, output: bool
) -> tuple[int, Job]:
    """`_follow` against a remote engine (no status line: the API does not say why a job
    waits)."""
    from . import remote

    try:
        job, arrived = remote.run(
            url,
            lambda c: remote.follow_job(c, ref, until=until, timeout=timeout, output=output),
        )
    except KeyboardInterrupt:
        typer.echo(
            f"corral: stopped following {ref}; the job goes on (corral wait {ref})", err=True
        )
        raise typer.Exit(130) from None
    if not arrived:
        typer.echo(f"corral: {job.id} is still {job.state.value} after {timeout}s", err=True)
        return 124, job
    return (exit_code_of(job) if job.state.terminal else 0), job


def _with_training(
    base: submissions.SubmitRequest,
    method: str | None,
    script: Path | None,
    *,
    notebook: str | None,
    model: str | None,
    dataset: str | None,
    compare_to: str | None,
    watch: list[str] | None,
    threshold: float | None,
    wandb_project: str | None,
) -> submissions.SubmitRequest:
    """The training job `--training` asks for (the arguments after `--` go to the script), or
    `base` without it (its options only with it)."""
    if method is None and script is None:
        if model or dataset or compare_to or watch or threshold is not None or wandb_project:
            raise InvalidRequest(
                "--model, --dataset, --compare-to, --watch, --regression-threshold and "
                "--wandb-project go with --training"
            )
        return base
    if method is None or script is None:
        raise InvalidRequest("a training job needs --training sft|dpo|grpo and --script")
    if notebook is not None:
        raise InvalidRequest("give --notebook or --training, not both")
    return trainings.training_request(
        replace(base, command=()),
        method,
        str(script),
        model=model,
        dataset=dataset,
        args=base.command,
        compare_to=compare_to,
        watch=tuple(watch or ()),
        threshold=threshold,
        wandb_project=wandb_project,
    )


def _with_notebook(
    base: submissions.SubmitRequest,
    notebook: str | None,
    *,
    param: list[str] | None,
    copyback: Path | None,
    hook_command: str | None,
    hook_url: str | None,
    cell_timeout: float | None,
) -> submissions.SubmitRequest:
    """`base`, or the notebook job `--notebook` asks for (its options only with it)."""
    if notebook is None:
        if param or copyback or hook_command or hook_url or cell_timeout is not None:
            raise InvalidRequest("--param, --copyback and --cell-timeout go with --notebook")
        return base
    if base.command:
        raise InvalidRequest("give a command or --notebook, not both")
    return notebooks.notebook_request(
        base,
        notebook,
        params=notebooks.parse_params(param or []),
        copyback=str(copyback) if copyback else None,
        hook_command=hook_command,
        hook_url=hook_url,
        cell_timeout_s=cell_timeout,
    )


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


def exit_code_of(job: Job) -> int:
    """The exit code `submit --wait` and `wait` report for a job that ended."""
    if job.state is JobState.SUCCEEDED:
        return 0
    if job.state in WAIT_EXIT:
        return WAIT_EXIT[job.state]
    return job.exit_code if job.exit_code not in (None, 0) else 1


def _follow(cfg: Config, ref: str, how: waiting.Follow) -> tuple[int, Job]:
    """Follow the job (cli/waiting.py); the exit code `submit --wait` and `wait` give, and the
    job as last seen."""
    from corral.cli.waiting import follow

    try:
        job, done = with_store(cfg, lambda st: follow(cfg, st, ref, how))
    except KeyboardInterrupt:
        typer.echo(
            f"corral: stopped following {ref}; the job goes on (corral wait {ref})", err=True
        )
        raise typer.Exit(130) from None
    if done is None:
        typer.echo(f"corral: {job.id} is still {job.state.value} after {how.timeout}s", err=True)
        return 124, job
    return (exit_code_of(job) if job.state.terminal else 0), job


def wait_cmd(
    job: JobArg,
    until: Annotated[str, typer.Option("--for", help="`end` (default) or `running`.")] = "end",
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Give up after this many seconds (exit 124).")
    ] = None,
    follow_output: FollowOpt = False,
    quiet: QuietOpt = False,
    no_engine_ok: NoEngineOkOpt = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Then print the job as JSON (as `show --json` without its "
            "timeline); no status on the way.",
        ),
    ] = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Block until a job ends (exit with its exit code, as `submit --wait`) or starts running.

    On a terminal a status line says why the job waits (queued behind N, an open breaker and
    until when, a pause, an approval, no engine); elsewhere a line on stderr when something
    holds it back. It fails at once (exit 7) when no engine serves the data directory.
    """
    if until not in ("end", "running"):
        fail(InvalidRequest(f"--for must be `end` or `running`, got {until!r}"))
    if timeout is not None:  # a one-line error (exit 2) from main()
        bounds.number("--timeout", timeout, low=0, high=bounds.MAX_EXPIRES_S, unit="seconds")
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        code, seen = _follow_remote(url, job, until, timeout, follow_output)
        if as_json:
            emit(remote.list_json(remote.run(url, lambda c: c.wait(seen.id, timeout_s=0))))
        raise typer.Exit(code)
    cfg = config_or_fail(data_dir, config)
    how = waiting.Follow(
        until=until,
        timeout=timeout,
        mode=waiting.mode_for(quiet=quiet or as_json),
        output=follow_output,
        no_engine_ok=no_engine_ok,
    )
    code, seen = _follow(cfg, job, how)
    if as_json:
        emit(views.job_json(with_store(cfg, lambda st: queries.job(st, seen.id))))
    raise typer.Exit(code)


def print_job_list(found: queries.JobList, title: str | None = None) -> None:
    views.print_jobs(found.jobs, title=title, short=found.short)


def jobs(
    state: Annotated[JobState | None, typer.Option("--state", "-s", case_sensitive=False)] = None,
    role: Annotated[str | None, typer.Option("--role", "-r")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """List jobs, newest first."""
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        page = remote.run(
            url, lambda c: c.list(state=state.value if state else None, role=role, limit=limit)
        )
        if as_json:
            emit([remote.list_json(j) for j in page.jobs])
        else:
            views.print_jobs([remote.job(j) for j in page.jobs])
        return
    query = JobQuery(state=state, role=role, limit=limit)
    listed = peek_jobs(data_dir, config, query)
    if listed is not None and (as_json or not listed):  # a table shows short ids: the store's
        if as_json:
            emit([views.job_json(j) for j in listed])
        else:
            views.print_jobs(listed, title=None, short={})
        return
    cfg = config_or_fail(data_dir, config)
    found = with_store(cfg, lambda st: queries.jobs(st, query, short=not as_json))
    if as_json:
        emit([views.job_json(j) for j in found.jobs])
    else:
        print_job_list(found)


def show(
    job: JobArg, as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """A job: its fields, its attempts and its timeline."""
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        v = remote.run(url, lambda c: remote.on_job(c, job, c.get))
        if as_json:
            emit(remote.show_json(v))
        else:
            views.print_job(
                remote.job(v),
                [remote.attempt(v.id, a) for a in v.attempts],
                [remote.event(v.id, e) for e in v.timeline],
            )
            views.print_agent_events([remote.agent_event(e) for e in v.agent_events])
        return
    cfg = config_or_fail(data_dir, config)
    d = with_store(cfg, lambda st: queries.job_detail(st, job))
    found = [
        schemas.TrainingRun(**dataclasses.asdict(r))
        for r in (runs.runs_in(d.timeline) if "training" in d.job.options.extra else [])
    ]
    if as_json:
        data = views.job_json(d.job, detail=True)
        data["attempts"] = [views.attempt_json(a) for a in d.attempts]
        data["timeline"] = [views.event_json(e) for e in d.timeline]
        data["agent_events"] = [views.agent_event_json(e) for e in d.agent_events]
        data["trace_id"] = d.trace_id
        data["runs"] = [r.dump() for r in found]
        emit(data)
    else:
        views.print_job(d.job, d.attempts, d.timeline)
        views.print_agent_events(d.agent_events)
        views.print_runs(found)


def trace(
    job: JobArg, as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """An agent job's traces: per attempt, every tool call (input, output, duration, denied or
    not and why), tokens, cost, checkpoints and the policy decisions taken on the way."""
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        tv = remote.run(url, lambda c: remote.on_job(c, job, c.trace))
        if as_json:
            emit(tv.dump())
            return
        shown = remote.run(url, lambda c: c.get(tv.job))
        t = queries.Trace(
            remote.job(shown),
            [remote.agent_event(e) for e in tv.agent_events],
            [remote.evaluation(e) for e in tv.policy_evaluations],
        )
    else:
        cfg = config_or_fail(data_dir, config)
        t = with_store(cfg, lambda st: queries.trace(st, job))
    j = t.job
    if as_json:
        emit(
            {
                "job": j.id,
                "state": j.state.value,
                "worker": j.worker,
                "agent_events": [views.agent_event_json(e) for e in t.agent_events],
                "policy_evaluations": [views.evaluation_json(e) for e in t.evaluations],
            }
        )
        return
    if not t.agent_events and not t.evaluations:
        typer.echo(
            f"job {j.id} ({j.worker}, {j.state.value}) has no agent trace yet"
            + ("" if j.state.terminal else ": attempts write theirs when they end")
        )
        return
    typer.echo(f"job {j.id}  {j.state.value}  {j.worker}  role {j.role}")
    views.print_agent_events(t.agent_events, full=True)
    pending = t.pending()
    if pending:
        typer.echo(f"running attempt: {len(pending)} policy decisions so far")
        for e in pending[-20:]:
            typer.echo(f"  {views.short_time(e.at)}  {e.verdict:<5}  {e.subject:<10} {e.reason}")


def logs(
    job: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option("--attempt", help="Only this attempt (default: all).")
    ] = None,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Print a job's stdout (to stdout) and stderr (to stderr), attempt by attempt."""
    from corral.cli.logs import stream_logs

    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        try:
            remote.run(url, lambda c: remote.copy_logs(c, job, follow=follow, only=attempt))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return
    cfg = config_or_fail(data_dir, config)
    try:
        with_store(cfg, lambda st: stream_logs(st, job, follow=follow, only=attempt))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def cancel(
    job: JobArg,
    reason: Annotated[
        str, typer.Option("--reason", help="Recorded on the job.")
    ] = "cancelled by operator",
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Cancel a queued or running job, and every job it submitted (unless their role is
    `detached`). The request is stored first, then the engine stops each attempt's whole
    process tree (SIGTERM, grace, SIGKILL)."""
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        c = remote.run(
            url, lambda api: remote.on_job(api, job, lambda whole: api.cancel(whole, reason))
        )
        if as_json:
            emit(c.dump())
        elif c.state.terminal:
            typer.echo(f"{c.id} {c.state.value}")
        else:
            typer.echo(f"{c.id} cancel requested; the engine is stopping it")
        return
    cfg = config_or_fail(data_dir, config)
    done = with_store(
        cfg,
        lambda st: cancellation.cancel(
            st, cfg, job, reason=reason, caller=control.caller_job(cfg.data_dir), wake=waker(cfg)
        ),
    )
    j, answered = done.job, done.engine_answered
    if as_json:
        emit({"id": j.id, "state": j.state.value, "cancel_requested": j.cancel_requested})
        return
    if j.state.terminal:
        typer.echo(f"{j.id} {j.state.value}")
    else:
        typer.echo(
            f"{j.id} cancel requested; "
            + (
                "the engine is stopping it"
                if answered
                else "no engine is running: it will be stopped when one starts"
            )
        )


def workspaces(
    as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """Workspaces locked by a job, and since when."""
    cfg = config_or_fail(data_dir, config)
    held = with_store(cfg, queries.workspaces)
    if as_json:
        emit([{"workspace": w, "job": j, "acquired_at": views.ts(t)} for w, j, t in held])
    elif not held:
        typer.echo("no workspace is locked")
    else:
        for w, j, t in held:
            typer.echo(f"{w}  held by {j} since {views.short_time(t)}")


def events(
    kind: Annotated[
        str | None,
        typer.Option("--kind", help="breaker, defense, escalation or permit (default: all)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """The core's recorded decisions: breaker transitions, defense stages, escalations."""
    cfg = config_or_fail(data_dir, config)
    found = with_store(cfg, lambda st: queries.core_events(st, kind=kind, limit=limit))
    if as_json:
        emit(found)
        return
    if not found:
        typer.echo("no core events recorded")
    for e in found:
        typer.echo(
            f"{views.short_time(e['at'])}  {e['kind']:<10} {views.event_subject(e)} "
            f"→ {e['state']}  {e['reason']}  {e['message']}"
        )
