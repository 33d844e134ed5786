"""OpenCode: `opencode run --format json`; Corral's plugin (opencode_plugin.js beside this
module, shipped as package data) asks the engine in `tool.execute.before`, and the role's scope
becomes OpenCode's tool permissions, so the model is offered only what the scope can allow."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.domain.models import Job
from corral.domain.settings import WorkerSpec
from corral.policy.scopes import Scope
from corral.workers.agents.base import (
    AgentWorker,
    Context,
    Gateway,
    agent_prompt,
    scope_tools,
    system_prompt,
)
from corral.workers.modelgate import TOKEN_ENV
from corral.workers.streams import OpenCodeStreamParser, StreamParser

# The plugin's source, a %-template: the hook's argv, the MCP servers, the built-in tools.
PLUGIN = Path(__file__).with_name("opencode_plugin.js")

# OpenCode's tool permissions (1.18), each with the tools it gates; the model is offered only
# the tools whose permission is not denied outright, so a scope hides what it cannot allow.
OPENCODE_GATES: dict[str, tuple[str, ...]] = {
    "edit": ("edit", "write", "apply_patch", "multiedit", "patch"),
    **{
        name: (name,)
        for name in (
            "bash",
            "read",
            "glob",
            "grep",
            "list",
            "task",
            "skill",
            "lsp",
            "todoread",
            "todowrite",
            "webfetch",
            "websearch",
            "codesearch",
            "question",
        )
    },
}
_OPENCODE_TOOLS = json.dumps(sorted({t for tools in OPENCODE_GATES.values() for t in tools}))


def opencode_permission(scope: Scope, operator: Any, servers: Sequence[str] = ()) -> dict[str, Any]:
    """The `permission` config of a governed OpenCode run: every tool gate the role's scope
    cannot allow is denied (last matching rule wins in OpenCode, so those denials come last and
    no operator pattern re-opens them); the operator's own rules refine the rest. OpenCode
    names an MCP tool `<server>_<tool>` after the server as configured (`servers`): `mcp__wandb`
    opens `wandb_*`."""
    spelled = {name.lower(): name for name in servers}
    gates = dict(OPENCODE_GATES)
    for name in map(str.lower, scope_tools(scope.rules)):  # a tool newer than the table
        if not name.startswith("mcp__"):
            gates.setdefault(name, (name,))
    offered = [g for g, tools in gates.items() if any(scope.offers(t) for t in tools)]
    offered += [
        "_".join((spelled.get(rule[0].lower(), rule[0]), *rule[1:]))
        + ("_*" if len(rule) == 1 else "")
        for rule in scope.mcp_rules
    ]
    rules = operator if isinstance(operator, Mapping) else {}
    default = operator if isinstance(operator, str) else rules.get("*", "allow")
    permission: dict[str, Any] = {"*": "deny", **{gate: default for gate in offered}}
    permission.update((k, v) for k, v in rules.items() if k != "*")
    for gate in sorted(gates.keys() - set(offered)):
        permission.pop(gate, None)
        permission[gate] = "deny"
    return permission


def opencode_mcp(servers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """A role's MCP servers (Claude Code's form) as OpenCode's `mcp` config."""
    out: dict[str, dict[str, Any]] = {}
    for name, server in servers.items():
        if server.get("type", "stdio") == "stdio":
            out[name] = {
                "type": "local",
                "command": [server["command"], *server.get("args", ())],
                "environment": dict(server.get("env") or {}),
                "enabled": True,
            }
        else:
            out[name] = {
                "type": "remote",
                "url": server["url"],
                "headers": dict(server.get("headers") or {}),
                "enabled": True,
            }
    return out


def opencode_gateway(
    providers: Any, gateway: Gateway, spec: WorkerSpec, model: str | None
) -> dict[str, Any]:
    """OpenCode's `provider` config with the gateway as the model's provider: its `baseURL`,
    and as its `apiKey` the attempt's token, read from the environment (`{env:…}`)."""
    out = dict(providers) if isinstance(providers, Mapping) else {}
    pid = (spec.gateway.provider if spec.gateway else None) or (
        model.split("/", 1)[0] if model and "/" in model else "openai"
    )
    entry = dict(out.get(pid) or {})
    entry["options"] = {
        **(entry.get("options") or {}),
        "baseURL": f"{gateway.url}/v1",
        "apiKey": f"{{env:{TOKEN_ENV}}}",
    }
    out[pid] = entry
    return out


def _opencode_agent(args: Sequence[str]) -> str:
    """The OpenCode agent a run uses: `--agent NAME` among the worker's args, else `build`."""
    for i, arg in enumerate(args):
        if arg == "--agent" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--agent="):
            return arg.split("=", 1)[1]
    return "build"


class OpenCodeWorker(AgentWorker):
    """`opencode run --format json`; a plugin's `tool.execute.before` asks the engine."""

    adapter = "opencode"
    default_binary = "opencode"
    graceful = "TERM"  # `opencode run` ignores SIGINT
    api_key_envs = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    turn_limit = "advisory"  # the agent's `steps`

    def prepare(self, job: Job, ctx: Context) -> dict[str, str]:
        config_home = ctx.home / "config"
        opencode = config_home / "opencode"
        (opencode / "plugin").mkdir(parents=True, exist_ok=True)
        # OpenCode `npm install`s its plugin SDK into a config dir at start-up unless the dir
        # looks installed already; our plugin needs none of it (and the network may be closed).
        (opencode / "node_modules").mkdir(exist_ok=True)
        dep = {"@opencode-ai/plugin": "*"}
        (opencode / "package.json").write_text(json.dumps({"dependencies": dep}))
        (opencode / "package-lock.json").write_text(
            json.dumps({"lockfileVersion": 3, "packages": {"": {"dependencies": dep}}})
        )
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            **self.spec.config,
        }
        if ctx.gateway is not None:
            config["provider"] = opencode_gateway(
                config.get("provider"), ctx.gateway, self.spec, ctx.model(self.spec)
            )
        if mcp := {**(config.get("mcp") or {}), **opencode_mcp(ctx.mcp_servers)}:
            config["mcp"] = mcp
        config["permission"] = opencode_permission(ctx.scope, config.get("permission"), list(mcp))
        (opencode / "plugin" / "corral.js").write_text(
            PLUGIN.read_text()
            % {
                "hook": json.dumps(ctx.hook),
                "mcp": json.dumps(sorted(mcp, key=len, reverse=True)),
                "builtin": _OPENCODE_TOOLS,
            }
        )
        if ctx.role.max_turns:  # OpenCode's step limit: at the last step the model is told to
            # stop and summarise (it is not enforced; max_tool_calls is the hard bound)
            agents = dict(config.get("agent") or {})
            name = _opencode_agent(self.spec.args)
            agents[name] = {**(agents.get(name) or {}), "steps": ctx.role.max_turns}
            config["agent"] = agents
        (opencode / "opencode.json").write_text(json.dumps(config))
        gateway = {TOKEN_ENV: ctx.gateway.token} if ctx.gateway is not None else {}
        return {
            **gateway,
            "XDG_CONFIG_HOME": str(config_home),
            "XDG_DATA_HOME": str(ctx.home / "data"),
            "XDG_STATE_HOME": str(ctx.home / "state"),
            "XDG_CACHE_HOME": str(ctx.home / "cache"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        }

    def argv(self, job: Job, ctx: Context) -> list[str]:
        role = ctx.role
        prompt = agent_prompt(job)
        if instructions := system_prompt(job, role):
            prompt = f"{instructions}\n\n{prompt}"
        argv = [ctx.binary, "run", "--format", "json"]
        if model := ctx.model(self.spec):
            argv += ["-m", model]
        if ctx.resume:
            argv += ["--session", ctx.resume]
        return argv + list(self.spec.args) + [prompt]

    @classmethod
    def parser_for(cls) -> StreamParser:
        return OpenCodeStreamParser()
