"""The `corral` command: an edge over the application services (services/). Every command reads
the configuration, calls a service (and pokes a running engine through its local socket), prints
tables for people or `--json` for scripts, and turns every CorralError into one line on stderr
with a distinct exit code (cli/edge.py). The command groups live in their modules: jobs.py,
dlq.py, governance.py, policy_cmds.py, mechanism.py, configs.py, guard.py."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import anyio
import typer

from corral import __version__
from corral.domain.errors import CorralError, InvalidRequest
from corral.workers import privacy

from . import edge
from .edge import config_or_fail, emit, load_config
from .exits import exit_code, fail
from .lazy import LazyGroup
from .options import ConfigOpt, DataDir, JsonOpt

if TYPE_CHECKING:
    from corral.config import Config
    from corral.runtime.engine import Engine
    from corral.runtime.servelock import ServeLock


def _data_dir_of(data_dir: Path | None) -> Path:
    return config_or_fail(data_dir, None).data_dir


# The command modules, each imported when one of its commands runs (or help lists them): a
# short command does not import what the others need (cli/lazy.py).
def _jobs(app: typer.Typer) -> None:
    from . import jobs

    jobs.register(app)


def _events(app: typer.Typer) -> None:
    from . import events

    app.add_typer(events.app, name="events")


def _dlq(app: typer.Typer) -> None:
    from . import dlq

    app.add_typer(dlq.app, name="dlq")


def _mechanism(app: typer.Typer) -> None:
    from . import mechanism

    mechanism.register(app, _data_dir_of)
    mechanism.register_metrics(app)


def _governance(app: typer.Typer) -> None:
    from . import governance

    governance.register(app)


def _configs(app: typer.Typer) -> None:
    from . import configs

    configs.register(app)


def _policy(app: typer.Typer) -> None:
    from . import policy_cmds

    policy_cmds.register(app)


def _guard(app: typer.Typer) -> None:
    from . import guard

    app.add_typer(guard.app, name="guard")


def _tokens(app: typer.Typer) -> None:
    from . import tokens

    app.add_typer(tokens.app, name="token")


def _retention(app: typer.Typer) -> None:
    from . import retention

    retention.register(app)


def _world(app: typer.Typer) -> None:
    from . import world

    app.add_typer(world.app, name="world")
    app.command("replay")(world.replay_cmd)


def _epics(app: typer.Typer) -> None:
    from . import epics

    app.add_typer(epics.app, name="epic")


def _knowledge(app: typer.Typer) -> None:
    from . import knowledge

    app.add_typer(knowledge.app, name="knowledge")


def _schema(app: typer.Typer) -> None:
    from . import schema_cmd

    schema_cmd.register(app)


class Commands(LazyGroup):
    """`corral`'s commands; those of the command modules are built on first use."""

    lazy = {
        **dict.fromkeys(
            ("submit", "wait", "jobs", "show", "trace", "logs", "cancel", "workspaces"), _jobs
        ),
        "events": _events,
        "dlq": _dlq,
        **dict.fromkeys(("status", "metrics", "breakers", "escalations"), _mechanism),
        **dict.fromkeys(
            ("report", "incidents", "runs", "pause", "resume", "audit", "kill-switch"),
            _governance,
        ),
        "approvals": _governance,
        "init": _configs,
        "config": _configs,
        **dict.fromkeys(("budget", "dark-launch", "policy"), _policy),
        "guard": _guard,
        "token": _tokens,
        "gc": _retention,
        "replay": _world,
        "world": _world,
        "epic": _epics,
        "knowledge": _knowledge,
        "schema": _schema,
    }
    # the order `corral --help` lists them in
    order = (
        *("version", "serve", "core", "submit", "wait", "jobs", "show", "trace", "logs"),
        *("cancel", "workspaces", "demo", "mcp", "status", "metrics", "report", "incidents"),
        *("runs", "pause", "resume", "init", "gc", "replay", "schema", "dlq", "events"),
        *("breakers", "escalations", "audit", "kill-switch", "approvals", "config", "budget"),
        *("dark-launch", "policy", "guard", "token", "world", "epic", "knowledge"),
    )


app = typer.Typer(
    cls=Commands,
    name="corral",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish)
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Corral keeps AI agents bounded: it queues jobs, grants each attempt a permit, "
    "stops, retries and records them.",
)

# What works against a remote engine's HTTP API (`--url`); every other command is local only.
REMOTE_COMMANDS = frozenset(
    {
        "submit",
        "jobs",
        "show",
        "cancel",
        "wait",
        "logs",
        "trace",
        "approvals",
        "kill-switch",
        "dlq",
        "knowledge",
        "epic",
        "version",
    }
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit(0)


# The one callback of the app (typer keeps only the last registered): options for every command.
@app.callback()
def _options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="CORRAL_URL",
            metavar="URL",
            help="Work against the engine serving the HTTP API at URL (with the token in "
            "CORRAL_TOKEN) instead of the local data directory: the job commands, approvals, "
            "kill switches and the dead-letter queue.",
            show_default=False,
        ),
    ] = None,
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print Corral's version and exit.",
        ),
    ] = False,
) -> None:
    """Corral keeps AI agents bounded: it queues jobs, grants each attempt a permit, stops,
    retries and records them."""
    url = (url or "").strip() or None
    if url is not None:
        if not url.startswith(("http://", "https://")):
            fail(InvalidRequest(f"--url must be an http:// or https:// address, got {url!r}"))
        command = ctx.invoked_subcommand
        if command is not None and command not in REMOTE_COMMANDS:
            fail(
                InvalidRequest(
                    f"`corral {command}` works on the local data directory only, not against "
                    f"--url {url} (unset CORRAL_URL, or run it on the engine's machine)"
                )
            )
    edge.set_remote(url)


@app.command()
def version(as_json: JsonOpt = False) -> None:
    """Print Corral's version."""
    if as_json:
        emit({"version": __version__})
    else:
        typer.echo(__version__)


class HttpListener(Protocol):
    """The HTTP API's socket, bound before the engine starts (api/server.py)."""

    @property
    def url(self) -> str: ...

    async def serve(self, engine: Engine) -> None: ...


# Bind the HTTP API's address (HOST:PORT, TLS files, plain HTTP beyond loopback or not):
# given by the entry point that wires the API in (corral/main.py); the CLI does not import it.
Listen = Callable[..., HttpListener]
DEFAULT_HTTP = "127.0.0.1:8765"


@app.command()
def serve(
    ctx: typer.Context,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
    drain: Annotated[
        bool, typer.Option("--drain", help="Exit once nothing is queued, waiting or running.")
    ] = False,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            metavar="HOST:PORT",
            help=f"Serve the HTTP API here (default {DEFAULT_HTTP}; port 0: any free one). "
            "Beyond loopback it needs --tls-cert/--tls-key or --insecure-http.",
        ),
    ] = None,
    no_http: Annotated[bool, typer.Option("--no-http", help="Serve no HTTP API.")] = False,
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key")] = None,
    insecure_http: Annotated[
        bool, typer.Option("--insecure-http", help="Allow plain HTTP on a non-loopback address.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the engine on this data directory until SIGTERM/SIGINT, with the HTTP API
    (docs/reference/http-api.md) unless --no-http.

    Attempts run in their own sessions: stopping (or crashing) the engine leaves them running,
    and the next engine on the same data directory re-adopts them and collects their results.
    """
    from corral.runtime.servelock import ServeLock

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = load_config(data_dir, config)
        # Taken before the engine's machinery is imported (a second or more on a busy machine):
        # a `corral submit --wait` right after `corral serve &` finds the engine starting.
        lock = ServeLock(cfg.data_dir)
        lock.acquire()

        def bind() -> HttpListener | None:
            if no_http:
                return None
            return _http_listener(
                ctx.obj, http, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure_http
            )

        anyio.run(_serve_engine, cfg, lock, drain, bind)
    except CorralError as err:
        fail(err)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


async def _waves(engine: Engine) -> None:
    from corral.runtime.assembly import is_shared
    from corral.services.waves import WaveRunner

    holder = engine.id if is_shared(engine.config) else None  # a lease only on a shared store
    await WaveRunner(engine.store, engine.config, wake=engine.wake, holder=holder).run()


def _http_listener(
    listen: Listen | None,
    address: str | None,
    *,
    tls_cert: Path | None,
    tls_key: Path | None,
    insecure: bool,
) -> HttpListener | None:
    """The HTTP API's bound socket. The default address taken (another engine on this machine)
    is a warning and no HTTP; an address given that cannot be bound is an error."""
    if listen is None:
        if address is not None:
            raise InvalidRequest("this entry point has no HTTP API (run the `corral` command)")
        return None
    try:
        return listen(
            address or DEFAULT_HTTP, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure
        )
    except InvalidRequest as err:
        if address is not None:
            raise
        typer.echo(f"corral: warning: {err}; serving without the HTTP API", err=True)
        return None


async def _serve_engine(
    cfg: Config, lock: ServeLock, drain: bool, bind: Callable[[], HttpListener | None]
) -> None:
    """Start the core child, then import (the engine, the HTTP API) and run the engine: the
    core's start, about a quarter of a second of its own imports, runs beside the engine's
    instead of after them."""
    from corral.runtime.corestart import core_argv, spawn_core, stop_core

    argv = core_argv(cfg)
    core = None if argv is None else await spawn_core(argv)
    try:
        listener = bind()
        from corral.runtime.engine import Engine
        from corral.services.knowledge import extractor_jobs as knowledge_jobs

        engine = Engine(cfg, lock, core)  # from here the engine stops it if it must
    except BaseException:
        if core is not None:
            await stop_core(core)
        raise
    # an agent extractor's jobs are submitted as any edge submits (services/knowledge.py)
    engine.flywheel.submit = knowledge_jobs(engine.store, cfg, engine.wake)

    def ready(e: Engine) -> None:
        typer.echo(f"corral engine {e.id} serving {cfg.data_dir} (pid {os.getpid()})", err=True)
        if listener is not None:
            typer.echo(f"corral: HTTP API on {listener.url}", err=True)

    also = [] if listener is None else [listener.serve]
    also.append(_waves)  # the FIRE loop of every running epic (services/waves.py)
    await engine.run(drain=drain, on_ready=ready, also=also)


@app.command("core")
def core_cmd(
    data_dir: DataDir = None,
    config: ConfigOpt = None,
    with_parent: Annotated[
        bool,
        typer.Option(
            "--with-parent",
            help="Be killed (SIGKILL) the moment the process that started this one dies, "
            "instead of when it reads the end of stdin. Linux delivers it when the starting "
            "thread ends: start it from a thread that lives as long as the driver.",
        ),
    ] = False,
) -> None:
    """Run the core alone, speaking JSON Lines on stdin/stdout (docs/reference/core-protocol.md).

    `corral serve` starts and supervises one of these (with --with-parent); another scheduler
    may drive one too.
    """
    from corral.runtime.coreproc import main as core_main

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    core_main(config_or_fail(data_dir, config), with_parent=with_parent)


@app.command()
def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Where the demo engine keeps its state, kept afterwards "
            "(default: a fresh temporary directory, removed at the end unless --keep).",
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary directory for inspection.")
    ] = False,
) -> None:
    """Start an engine and govern a small demo fleet live: retries into the dead-letter queue,
    a timeout, a cancel, a deduplicated submission, a dependency chain."""
    from corral.cli.demo import run_demo

    try:
        raise typer.Exit(run_demo(data_dir, keep=keep))
    except CorralError as err:
        fail(err)


@app.command("mcp")
def mcp_cmd(
    data_dir: DataDir = None,
    config: ConfigOpt = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Offer reading only: submit_job is refused.")
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="CORRAL_TOKEN",
            show_envvar=True,
            help="Act as this token's tenant with its scopes (prefer the environment "
            "variable: an argument shows in the process list).",
        ),
    ] = None,
    parent: Annotated[
        str | None,
        typer.Option(
            "--parent",
            envvar="CORRAL_JOB_ID",
            help="Jobs submitted become this job's children (set inside a Corral job).",
        ),
    ] = None,
) -> None:
    """Serve Corral's MCP tools over stdio, for an agent CLI (docs/how-to/mcp.md).

    Tools: job_status, list_jobs, job_trace_summary, cluster_state, queue_depth, and
    submit_job (governed like `corral submit`). Without a token the caller is the local user:
    the default tenant, reading and submitting (reading only with --read-only).

    List it in a role's mcp_config file (Claude Code's form) to let its agent ask Corral:

    \b
      {"mcpServers": {"corral": {"command": "corral",
        "args": ["mcp", "--data-dir", "/srv/corral", "--read-only"]}}}

    and allow the tools in the role's scope, e.g. tools: ["mcp__corral__job_status",
    "mcp__corral__queue_depth"]: each call is then decided like any other tool call.
    """
    from corral.mcp.stdio import serve_stdio  # the MCP SDK: only this command loads it

    cfg = config_or_fail(data_dir, config)
    try:
        anyio.run(
            lambda: serve_stdio(cfg, token=token, read_only=read_only, parent_job=parent or None)
        )
    except CorralError as err:
        fail(err)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")  # what typer's completion knows


def _named_shell(argv: list[str]) -> None:
    """`corral --show-completion bash` (or `--install-completion zsh`): typer looks for the
    current shell among the command's parents and does not take a name, so a script run by `sh`
    (a Dockerfile's RUN, CI) got "Shell sh not supported". Given a shell's name after the
    option, typer is asked for the variant of its options that takes one (its switch is an
    environment variable read when the command is built)."""
    for option in ("--show-completion", "--install-completion"):
        if option in argv[:-1] and argv[argv.index(option) + 1] in SHELLS:
            os.environ["_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION"] = "1"


def main(http: Listen | None = None) -> None:
    """Entry point of the `corral` command (corral/main.py passes the HTTP API's `listen`)."""
    privacy.make_private()  # every file Corral creates is its user's alone, whatever the umask
    _named_shell(sys.argv[1:])
    try:
        code = app(standalone_mode=False, obj=http)  # returns the code of a `typer.Exit`
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
        typer.echo(
            f"corral: internal error: {type(err).__name__}: {err} "
            "(set CORRAL_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(70)


def _usage_line(err: Exception) -> str:
    """`No such option: --usd` → `no such option: --usd (see `corral budget set --help`)`."""
    message = getattr(err, "format_message", lambda: str(err))()
    message = message[:1].lower() + message[1:].rstrip(".")
    ctx = getattr(err, "ctx", None)
    return message if ctx is None else f"{message} (see `{ctx.command_path} --help`)"
