"""Agent workers under the shim, governed per tool call: what every CLI adapter shares.

Each attempt runs `corral-shim … -- python -m corral.workers.runner -- <cli> …`: the shim owns
the process tree and the deadline, its output pump redacts the CLI's stream on its way to the logs
(the API keys, the role's MCP secrets and the job's own among the values it hides), the runner
passes a stop on the CLI's own way, and the CLI calls `corral-hook` before every tool call, which
asks the engine (runtime/governor.py) and fails closed. What each CLI needs (flags, hook
registration, resume, graceful signal, hook reply) is described in docs/how-to/agents.md and
docs/explanation/governance.md; each adapter (claude.py, codex.py, opencode.py beside this
module) builds it from the job, its role and the worker's configuration. Every file an adapter
writes lives in the attempt directory or in the agent's home (`<data dir>/agent-home/<session
root job>`), which a resumed session reuses.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

from corral.domain.errors import WorkerError, WorkerMisconfigured
from corral.domain.models import Attempt, AttemptResult, Job, Permit
from corral.domain.settings import RoleSpec, WorkerSpec
from corral.domain.states import Fault, Outcome
from corral.policy.redact import SECRET_NAME, Redactor
from corral.policy.scopes import Scope
from corral.workers import native, privacy, process
from corral.workers.command import Launch, ShimAttempt, job_env, to_result, vanished
from corral.workers.faults import agent_fault
from corral.workers.modelgate import read_endpoint
from corral.workers.process import STDOUT, ShimResult
from corral.workers.streams import StreamParser, StreamSummary

AGENT_FILE = "agent.json"  # what the adapter started: CLI, version, session, for the collector
GOVERNANCE_SOCKET = "governance.sock"


def governance_socket(data_dir: Path) -> Path:
    """`<data dir>/governance.sock`, or a short /tmp name when that is too long for AF_UNIX."""
    p = data_dir / GOVERNANCE_SOCKET
    if len(str(p)) < 100:
        return p
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path("/tmp") / f"corral-gov-{digest}.sock"


def agent_home(data_dir: Path, job: Job, adapter: str) -> Path:
    """Private CLI state (sessions) shared by every attempt of a session lineage."""
    root = job.options.session_root or job.id
    return data_dir / "agent-home" / root / adapter


def attempt_ref(job: Job, attempt_index: int) -> str:
    """How the hook names an attempt: `<job id>.<attempt index>`."""
    return f"{job.id}.{attempt_index}"


def scope_tools(scope: Sequence[str]) -> list[str]:
    """The tool names a scope mentions (`Bash(kubectl *)` → `Bash`), in order, once each."""
    names: list[str] = []
    for rule in scope:
        name = rule.split("(", 1)[0].strip()
        if name and name not in names:
            names.append(name)
    return names


def secret_env(spec: WorkerSpec, adapter: type[AgentWorker] | None) -> dict[str, str]:
    """An agent attempt's secret variables from its worker, name → value: the worker's
    secret-looking `env` keys, then what the engine's environment holds of the worker's
    `pass_env` and the adapter's API-key variables. (The job's own — `--secret-env`, sealed
    values — come with the job: workers/sealing.py.) The pump and the governor redact them."""
    found = {k: v for k, v in spec.env.items() if SECRET_NAME.search(k)}
    names = (*spec.pass_env, *(adapter.api_key_envs if adapter else ()))
    found.update({n: os.environ[n] for n in names if n in os.environ})
    if (key := gateway_key(spec)) and spec.gateway and spec.gateway.key_env:
        found[spec.gateway.key_env] = key  # never given to the CLI, redacted all the same
    return found


# Every variable a CLI authenticates to a provider with (workers/credentials.py)
PROVIDER_CREDENTIALS = frozenset(
    {
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "OPENAI_API_KEY",
        "CODEX_API_KEY",
    }
)


def provider_key_names(spec: WorkerSpec, adapter: type[AgentWorker] | None) -> set[str]:
    """The variables that hold a provider credential: the adapter's API-key variables, the
    ones the CLIs know, and the gateway's `key_env`. A worker behind the model gateway hands
    none of them to its CLI."""
    names = set(adapter.api_key_envs if adapter else ()) | PROVIDER_CREDENTIALS
    if spec.gateway is not None and spec.gateway.key_env:
        names.add(spec.gateway.key_env)
    return names


def gateway_key(spec: WorkerSpec, environ: Mapping[str, str] = os.environ) -> str | None:
    """The provider key the gateway sends upstream for a worker: its `key_env` from the
    worker's `env`, else from the engine's environment."""
    name = spec.gateway.key_env if spec.gateway else None
    if not name:
        return None
    return spec.env.get(name) or environ.get(name)


def mcp_secrets(role: RoleSpec | None) -> list[str]:
    """What a role's MCP servers' `env` and `headers` hold under secret-looking names (an
    `Authorization` header included)."""
    return [
        v
        for server in (role.mcp_servers.values() if role else ())
        for table in ("env", "headers")
        for k, v in (server.get(table) or {}).items()
        if SECRET_NAME.search(k) or k.lower() == "authorization"
    ]


def secret_values(
    spec: WorkerSpec, adapter: type[AgentWorker] | None, role: RoleSpec | None
) -> list[str]:
    """Every value an agent attempt's logs, traces and evaluations must not show."""
    return [*secret_env(spec, adapter).values(), *mcp_secrets(role)]


@functools.cache
def _version_of(binary: str, mtime: float) -> str | WorkerError:
    """The version `binary --version` prints, or why it cannot be told. Both are cached (per
    binary and modification time: a reinstalled binary is asked again), so a CLI that hangs
    costs its 30 s once, off the core's event loop (`AgentWorker.ready`)."""
    del mtime
    try:
        out = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return WorkerError(f"cannot run {binary} --version: {exc}")
    found = re.search(r"\d+\.\d+\.\d+[\w.\-]*", out.stdout + out.stderr)
    if found is None:
        return WorkerError(f"{binary} --version printed no version")
    return found.group(0)


class AgentWorker(ABC):
    """Shared by the three CLIs: spawn under the shim and runner; finish from the stream."""

    adapter = ""
    default_binary = ""
    graceful = "TERM"
    api_key_envs: tuple[str, ...] = ()
    # What the CLI makes of a role's max_turns: "enforced", "advisory" (the model is told to
    # stop), or None (no turn limit at all)
    turn_limit: str | None = "enforced"
    # Whether the CLI offers the model only the tools the role's scope can allow (so a call to
    # any other was refused by the CLI itself, never run): Claude Code's --tools, OpenCode's
    # denied permissions. Codex cannot remove its built-in tools.
    hides_tools = True

    def __init__(
        self,
        validate: Callable[[Permit], None],
        spec: WorkerSpec,
        roles: Mapping[str, RoleSpec],
        data_dir: Path,
        launch: Launch | None = None,
    ) -> None:
        self._validate = validate
        self.spec = spec
        self.kind = spec.name
        self.roles = roles
        self.data_dir = data_dir
        self.launch = launch or Launch()

    # ---- what a CLI adapter provides ----------------------------------------------------

    @abstractmethod
    def argv(self, job: Job, ctx: Context) -> list[str]: ...

    @abstractmethod
    def prepare(self, job: Job, ctx: Context) -> dict[str, str]:
        """Write the CLI's configuration files; return the environment it needs."""

    @classmethod
    @abstractmethod
    def parser_for(cls) -> StreamParser: ...

    def new_session_id(self) -> str | None:
        """A session id chosen before the start, for CLIs that accept one."""
        return None

    # ---- shared ---------------------------------------------------------------------------

    def binary(self) -> str:
        name = self.spec.binary or self.default_binary
        found = shutil.which(name)
        if found is None:
            raise WorkerMisconfigured(
                f"{self.kind}: agent CLI {name!r} not found (set "
                f"workers.{self.kind}.binary, or run scripts/agent-clis "
                "and put agent-clis/node_modules/.bin on PATH)"
            )
        return found

    def ready(self) -> None:
        """Find the CLI and ask its version (a node CLI takes a second or more to answer): the
        core runs this in a thread before `start`, which then reads the cached answer."""
        self.version(self.binary())

    def version(self, binary: str) -> str:
        found = _version_of(binary, os.stat(binary).st_mtime)
        if isinstance(found, WorkerError):
            raise WorkerError(str(found))
        if self.spec.version and found != self.spec.version:
            raise WorkerMisconfigured(
                f"{self.kind}: pinned to {self.spec.version} but {binary} is {found}"
            )
        return found

    def role(self, job: Job) -> RoleSpec:
        return self.roles.get(job.role) or RoleSpec(name=job.role)

    def home(self, job: Job) -> Path:
        """Private CLI state (sessions) shared by every attempt of a session lineage."""
        return agent_home(self.data_dir, job, self.adapter)

    def shell_env(self) -> dict[str, str]:
        """The environment that makes the CLI's shell tool run bash (what the checker reads
        commands as), whatever the engine's own SHELL is."""
        bash = shutil.which("bash")
        if bash is None:
            raise WorkerError(
                f"{self.kind}: bash not found; Corral checks agents' commands as "
                "bash (or sh) and runs them with bash"
            )
        return {"SHELL": bash}

    @classmethod
    def reply(cls, verdict: str, message: str) -> tuple[int, str]:
        """A PreToolUse verdict in the CLI's hook language, as the hook's (exit code, text):
        exit 2 with the reason on stderr blocks the call (Codex; OpenCode through Corral's
        plugin, which turns it into the tool's error)."""
        if verdict == "allow":
            return 0, ""
        return 2, message

    @classmethod
    def call_shell(cls, payload: Mapping[str, Any], home: Path) -> tuple[str, str | None]:
        """The shell a shell tool call runs under (``bash`` or ``sh``), or why it cannot be
        told. Claude Code and OpenCode run their shell tool with `SHELL`, which `start` sets
        to bash: the shell the checker then reads the command as."""
        del payload, home
        return "bash", None

    def start(self, permit: Permit, job: Job, attempt: Attempt) -> ShimAttempt:
        self._validate(permit)  # no process without a live permit, whoever calls
        job, output = self.launch.prepare(job)
        binary = self.binary()
        version = self.version(binary)
        attempt_dir = Path(attempt.dir)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        resume = job.options.resume_session
        gateway = None
        if self.spec.gateway is not None:
            endpoint = read_endpoint(self.data_dir)
            gateway = Gateway(
                url=endpoint.url, token=endpoint.token(attempt_ref(job, attempt.index), permit.id)
            )
        ctx = Context(
            binary=binary,
            attempt_dir=attempt_dir,
            home=self.home(job),
            hook=[
                str(native.hook_path()),
                str(governance_socket(self.data_dir)),
                attempt_ref(job, attempt.index),
                permit.id,
                self.adapter,
                str(round(self.spec.hook_timeout_s * 1000)),
            ],
            role=self.role(job),
            resume=str(resume) if resume else None,
            session_id=str(resume) if resume else self.new_session_id(),
            gateway=gateway,
        )
        # The CLI's own session state (transcripts it needs to resume): private to this user.
        # It is the agent's memory, kept as the CLI wrote it, not Corral's record.
        ctx.home.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "agent-home").chmod(0o700)
        env = job_env(job.with_(attempts=attempt.index))
        # A private HOME: the CLI's dotfiles and its tools' login shells stay out of the
        # operator's own (a worker's `env: {HOME: …}` says otherwise).
        env["HOME"] = str(ctx.home)
        env.update(self.spec.env)
        secrets = secret_env(self.spec, type(self))
        env.update(secrets)
        if gateway is not None:  # the provider key stays in the engine: the CLI has a token
            for name in provider_key_names(self.spec, type(self)):
                env.pop(name, None)
        env.update(self.prepare(job, ctx))
        env.update(self.shell_env())
        env["CORRAL_WORKER"] = self.kind
        env.pop("CLAUDECODE", None)
        # The pump redacts them all from the logs; the MCP servers' secrets reach it without
        # passing through the CLI's (and its tools') environment.
        output = replace(
            output, secrets=(*output.secrets, *secrets.values(), *mcp_secrets(ctx.role))
        )
        argv = [
            sys.executable,
            "-m",
            "corral.workers.runner",
            "--graceful",
            self.graceful,
            "--",
            *self.argv(job, ctx),
        ]
        (attempt_dir / AGENT_FILE).write_text(
            json.dumps(
                {
                    "adapter": self.adapter,
                    "cli_version": version,
                    "binary": binary,
                    "session_id": ctx.session_id,
                    "resumed": bool(resume),
                }
            )
        )
        proc = process.spawn(
            attempt_dir=attempt_dir,
            argv=argv,
            cwd=job.cwd,
            env=env,
            grace_s=permit.grace_s,
            deadline_epoch_s=permit.deadline_at,
            term_child_only=True,
            output=output,
            via=self.launch.zygote,
        )
        return AgentAttempt(proc, self, job)

    def adopt(self, job: Job, attempt: Attempt) -> AgentAttempt | AttemptResult:
        found = process.probe(Path(attempt.dir))
        if found.state == "running" and found.process is not None:
            found.process.deadline_at = attempt.deadline_at
            found.process.grace_s = job.limits.grace_s
            return AgentAttempt(found.process, self, job)
        if found.state == "finished" and found.result is not None:
            self.scrub_home(job)  # it ended while no engine watched
            return self.finished(found.result, Path(attempt.dir))
        if found.state == "vanished":
            return vanished(Path(attempt.dir))
        return vanished(Path(attempt.dir), "engine stopped before the process started")

    def secrets_of(self, job: Job) -> tuple[str, ...]:
        """Every value an attempt of `job` must not leave anywhere: the job's own, its worker's
        API keys and secret variables, its role's MCP servers' secrets."""
        _, output = self.launch.prepare(job)
        worker = secret_env(self.spec, type(self)).values()
        return (*output.secrets, *worker, *mcp_secrets(self.role(job)))

    def scrub_home(self, job: Job) -> None:
        """The CLI's session memory in the agent's home keeps what the model saw and what
        Corral gave the CLI (its MCP servers' settings): once the attempt is over, every secret
        of the job is masked there too, and the modes narrowed (docs/how-to/secrets.md). A
        resumed session reads `****` where a secret was; the environment gives it again."""
        try:
            values = self.secrets_of(job)
        except WorkerError:  # its secrets cannot be known (a missing key): shapes at least
            values = ()
        privacy.scrub_tree(self.home(job), Redactor(values))

    def finished(self, r: ShimResult, attempt_dir: Path) -> AttemptResult:
        """The shim's record, with the cost, verdict and final error the agent's own stream
        reports (a CLI may exit 0 after an error result: Claude Code 2.1.330 after SIGINT), and
        whose failure it was (workers/faults.py)."""
        base = to_result(r)
        summary = summarize_stream(self.parser_for(), attempt_dir / STDOUT, base.exit_code)
        fault = agent_fault(base, summary)
        if summary is None:
            return replace(base, fault=fault)
        out = replace(base, cost_usd=summary.cost_usd, fault=fault)
        if base.outcome is not Outcome.EXITED or summary.succeeded:
            return out
        if summary.results_seen or summary.api_failed or summary.api_retrying:
            return replace(out, error=agent_error(summary, fault))
        return replace(out, error=f"agent CLI {base.describe()} before any result")


def agent_error(summary: StreamSummary, fault: Fault | None) -> str:
    """The agent's final error for people: its subtype, the API status, the CLI's own words."""
    kind = summary.error_subtype
    if kind in (None, "is_error"):
        kind = summary.terminal_reason or kind
    status = f"HTTP {summary.api_error_status}" if summary.api_error_status else None
    detail = ", ".join(x for x in (kind, status) if x) or "no final result"
    why = " ".join((summary.error_message or "").split()) or "the CLI gave no reason"
    line = f"agent failed ({detail}): {why}"
    if fault is Fault.CONFIG:
        line += " [not retried: fix the worker's credentials or model]"
    return line


def summarize_stream(
    parser: StreamParser, path: Path, exit_code: int | None, now: float = 0.0
) -> StreamSummary | None:
    """Feed a whole stream file through a parser; None when the CLI wrote none."""
    try:
        with path.open("rb") as f:
            for line in f:
                parser.feed(line, now)
    except FileNotFoundError:
        return None
    return parser.finish(exit_code, now)


class AgentAttempt(ShimAttempt):
    """A running agent attempt; its result is read from the stream as well as the shim."""

    def __init__(self, proc: process.ShimProcess, worker: AgentWorker, job: Job) -> None:
        super().__init__(proc)
        self.worker = worker
        self.job = job

    async def wait(self) -> AttemptResult:
        try:
            shim = await self.proc.wait()
        finally:
            self.proc.close()
        # file work off the event loop: the core keeps answering its heartbeats meanwhile
        await anyio.to_thread.run_sync(self.worker.scrub_home, self.job)
        return self.worker.finished(shim, self.proc.attempt_dir)


@dataclass(frozen=True, slots=True)
class Gateway:
    """Where the attempt's CLI sends its model calls, and the token it shows there."""

    url: str
    token: str


class Context:
    """What one attempt's invocation is built from."""

    def __init__(
        self,
        *,
        binary: str,
        attempt_dir: Path,
        home: Path,
        hook: list[str],
        role: RoleSpec,
        resume: str | None,
        session_id: str | None,
        gateway: Gateway | None = None,
    ) -> None:
        self.gateway = gateway
        self.binary = binary
        self.attempt_dir = attempt_dir
        self.home = home
        self.hook = hook
        self.role = role
        self.resume = resume
        self.session_id = session_id
        self.scope = Scope.parse(role.tools)
        # The role's MCP servers that its scope names: a server none of whose tools may run is
        # not started at all.
        self.mcp_servers = {
            name: server
            for name, server in role.mcp_servers.items()
            if self.scope.offers_server(name)
        }

    def hook_command(self) -> str:
        return " ".join(self.hook)  # every part is a plain path or token: no quoting needed

    def model(self, spec: WorkerSpec) -> str | None:
        return self.role.model or spec.model


def system_prompt(job: Job, role: RoleSpec) -> str:
    """What the agent's system prompt gets appended: the role's instructions, then the
    learnings the dispatcher injected for this attempt (runtime/flywheel.py), if any."""
    return "\n\n".join(p for p in (role.system_prompt, job.options.knowledge or "") if p)


def agent_prompt(job: Job) -> str:
    """What the agent is asked: the job's prompt, or its command as one line."""
    if job.prompt:
        return job.prompt
    if job.command:
        return " ".join(job.command)
    raise WorkerError(f"job {job.id} has no prompt for an agent")
