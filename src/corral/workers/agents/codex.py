"""Codex CLI: `codex exec --json`, its hooks from `$CODEX_HOME/hooks.json` and its settings as
`-c key=value` TOML; the shell a call runs under is read from its session (codexcalls.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.domain.errors import WorkerError
from corral.domain.models import Job
from corral.policy.scopes import Scope, shell_command
from corral.workers.agents.base import AgentWorker, Context, agent_prompt, system_prompt
from corral.workers.codexcalls import codex_shell_call
from corral.workers.modelgate import TOKEN_ENV
from corral.workers.streams import CodexStreamParser, StreamParser


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise WorkerError(f"codex config value {value!r} cannot be written as TOML")


def _flatten(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            key = str(k) if _BARE_KEY.fullmatch(str(k)) else json.dumps(str(k))
            out += _flatten(f"{prefix}.{key}" if prefix else key, v)
        return out
    return [(prefix, value)]


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
MCP_STARTUP_S = 60  # how long Codex waits for a required MCP server (a loaded machine is slow)


def _codex_mcp(servers: Mapping[str, Mapping[str, Any]], scope: Scope) -> dict[str, dict[str, Any]]:
    """A role's MCP servers as Codex `mcp_servers` settings. Codex's own approval of MCP calls
    is switched to `approve`: the PreToolUse hook (the engine) decides each one. A server the
    scope names tool by tool gets `enabled_tools`, so Codex cannot even find the others. Each
    server is `required`: Codex otherwise sends the first turn before a server slow to start
    (`corral mcp` takes a second or two) has listed its tools, and a call to one of them is then
    "unsupported"; required, Codex waits for it (up to MCP_STARTUP_S), and fails at start if it
    cannot start."""
    named: dict[str, list[str]] = {}
    for rule in scope.mcp_rules:
        if len(rule) == 2:
            named.setdefault(rule[0].lower(), []).append(rule[1])
    out: dict[str, Any] = {}
    for name, server in servers.items():
        if server.get("type", "stdio") == "stdio":
            entry: dict[str, Any] = {
                "command": server["command"],
                "args": list(server.get("args") or ()),
                "env": dict(server.get("env") or {}),
            }
        else:
            entry = {"url": server["url"], "http_headers": dict(server.get("headers") or {})}
        if (name.lower(),) not in scope.mcp:  # not the whole server: the tools it names
            entry["enabled_tools"] = sorted(named.get(name.lower(), ()))
        out[name] = {
            **entry,
            "default_tools_approval_mode": "approve",
            "required": True,
            "startup_timeout_sec": MCP_STARTUP_S,
        }
    return out


class CodexWorker(AgentWorker):
    """`codex exec --json`; PreToolUse/PostToolUse hooks from `$CODEX_HOME/hooks.json`."""

    adapter = "codex"
    default_binary = "codex"
    graceful = "TERM"
    api_key_envs = ("OPENAI_API_KEY", "CODEX_API_KEY")
    turn_limit = None  # `codex exec` has no max-turns flag
    hides_tools = False  # its hook refuses out-of-scope calls instead

    def prepare(self, job: Job, ctx: Context) -> dict[str, str]:
        hook = {
            "type": "command",
            "command": ctx.hook_command(),
            "timeout": max(1, round(self.spec.hook_timeout_s + 5)),
        }
        hooks = {
            "hooks": {
                event: [{"matcher": "*", "hooks": [hook]}]
                for event in ("PreToolUse", "PostToolUse")
            }
        }
        (ctx.home / "hooks.json").write_text(json.dumps(hooks))
        env = {"CODEX_HOME": str(ctx.home)}
        if ctx.gateway is not None:
            env[TOKEN_ENV] = ctx.gateway.token
        return env

    def argv(self, job: Job, ctx: Context) -> list[str]:
        role = ctx.role
        prompt = agent_prompt(job)
        if instructions := system_prompt(
            job, role
        ):  # codex exec has no flag of its own for a role's instructions
            prompt = f"{instructions}\n\n{prompt}"
        argv = [ctx.binary, "exec"]
        if ctx.resume:
            argv.append("resume")
        # Our hooks are not "reviewed" in Codex's trust store: run them anyway. No interactive
        # sessions: text typed into one (`write_stdin`) reaches no hook, so it could not be
        # checked (docs/explanation/governance.md).
        argv += [
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-hook-trust",
            "--disable",
            "unified_exec_tty",
        ]
        if not ctx.resume and not any(a in ("-s", "--sandbox") for a in self.spec.args):
            argv += ["--sandbox", "workspace-write"]  # the job's cwd is its workspace
        if model := ctx.model(self.spec):
            argv += ["-m", model]
        config = dict(self.spec.config)
        if ctx.gateway is not None:  # Corral's gateway as the model provider
            config["model_provider"] = "corral"
            providers = dict(config.get("model_providers") or {})
            # the operator's own settings of it (retries, timeouts) kept; where it is, ours
            providers["corral"] = {
                **(providers.get("corral") or {}),
                "name": "corral",
                "base_url": f"{ctx.gateway.url}/v1",
                "env_key": TOKEN_ENV,
                "wire_api": "responses",
            }
            config["model_providers"] = providers
        if servers := _codex_mcp(ctx.mcp_servers, ctx.scope):
            config["mcp_servers"] = {**(config.get("mcp_servers") or {}), **servers}
        for key, value in _flatten("", config):
            argv += ["-c", f"{key}={_toml_value(value)}"]
        argv += list(self.spec.args)
        if ctx.resume:
            argv.append(ctx.resume)
        return [*argv, prompt]

    @classmethod
    def parser_for(cls) -> StreamParser:
        return CodexStreamParser()

    def shell_env(self) -> dict[str, str]:
        return {}  # Codex picks the user's login shell, or the one the model names, per call

    @classmethod
    def call_shell(cls, payload: Mapping[str, Any], home: Path) -> tuple[str, str | None]:
        """Codex's hook leaves the model's `shell`, `tty` and sandbox escalation out: they are
        read from the session transcript (workers/codexcalls.py)."""
        found = codex_shell_call(payload, home)
        if isinstance(found, str):
            return "bash", found
        tool_input = payload.get("tool_input")
        command = shell_command(tool_input) if isinstance(tool_input, Mapping) else None
        if command != found.command:
            return found.shell, "the hook's command is not the one Codex will run"
        return found.shell, None
