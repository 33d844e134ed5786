"""Runtime policy: may this tool call of a governed agent run? (seed 000 runtime policy engine)

A pure decision from the permit's budget, what the attempt has used so far, and the role's tool
scope. Order: token budgets, then the tool-call budget (both end the attempt: the call is denied
with a reason the agent can read, and the agent is stopped after a short grace), then the scope
(a denial the agent can recover from: it may try something in scope).

Scope rules are Claude Code's notation, parsed: `Read` allows the tool; `Bash(kubectl *)` allows
shell commands every part of which matches a pattern (policy/shell.py parses the command the
way the shell will run it); `mcp__server` allows every tool of one MCP server and
`mcp__server__tool` one of them. Tool names compare case-insensitively, so one scope serves
every CLI (`Bash` in Claude Code and Codex is `bash` in OpenCode).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.domain.agents import Verdict
from corral.domain.models import Limits
from corral.policy.shell import check_scope

SHELL_TOOLS = frozenset({"bash", "shell", "exec_command", "local_shell", "run_shell_command"})
# One scope for every CLI: the names a CLI uses for what a scope calls Edit/Write.
ALIASES = {"apply_patch": ("edit", "write"), "multiedit": ("edit",), "list": ("glob", "ls")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What an attempt has used when it asks for its next tool call."""

    tool_calls: int  # calls allowed so far
    tokens_in: int
    tokens_out: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    verdict: Verdict
    reason: str  # machine code: allowed | out_of_scope | max_tool_calls | token_budget_in | …
    message: str  # for the agent (a denial's text reaches the model) and for people
    limit: str | None = None  # the runtime limit reached: the attempt is stopped after a grace
    rule: str | None = None  # the scope rule that allowed the call


@dataclass(frozen=True, slots=True)
class Scope:
    """A role's tool scope, parsed once."""

    tools: frozenset[str] = frozenset()  # allowed with any input (lower-case)
    commands: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # tool → patterns
    mcp: frozenset[tuple[str, ...]] = frozenset()  # ("server",) or ("server", "tool"), lower
    mcp_rules: tuple[tuple[str, ...], ...] = ()  # the same, spelled as written
    rules: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rules: Sequence[str]) -> Scope:
        tools: set[str] = set()
        commands: dict[str, list[str]] = {}
        mcp: list[tuple[str, ...]] = []
        for rule in rules:
            rule = rule.strip()
            name, _, rest = rule.partition("(")
            name = name.strip()
            if not name:
                raise ValueError(f"tool scope rule {rule!r} names no tool")
            if rest:
                if not rest.endswith(")"):
                    raise ValueError(f"tool scope rule {rule!r}: missing `)`")
                commands.setdefault(name.lower(), []).append(rest[:-1].strip())
            elif name.lower().startswith("mcp__"):
                parts = tuple(p for p in name.split("__")[1:] if p)
                if not 1 <= len(parts) <= 2:
                    raise ValueError(f"tool scope rule {rule!r}: use mcp__server or "
                                     "mcp__server__tool")
                mcp.append(parts)
            else:
                tools.add(name.lower())
        return cls(tools=frozenset(tools),
                   commands={k: tuple(v) for k, v in commands.items()},
                   mcp=frozenset(tuple(p.lower() for p in parts) for parts in mcp),
                   mcp_rules=tuple(mcp), rules=tuple(rules))

    def offers(self, tool: str) -> bool:
        """Whether some call of `tool` can be in scope: a CLI that can hide the other tools from
        the model hides them (the call-by-call check still decides each call)."""
        name = tool.lower()
        return (name in self.tools or any(a in self.tools for a in ALIASES.get(name, ()))
                or self._mcp_rule(name) is not None or bool(self._patterns(name)))

    def offers_server(self, server: str) -> bool:
        """Whether some tool of the MCP server `server` can be in scope."""
        return any(allowed[0] == server.lower() for allowed in self.mcp)

    def _mcp_rule(self, name: str) -> str | None:
        if not name.startswith("mcp__"):
            return None
        parts = tuple(p for p in name.split("__")[1:] if p)
        for allowed in self.mcp:
            if parts[:len(allowed)] == allowed and len(parts) >= len(allowed):
                return "mcp__" + "__".join(allowed)
        return None

    def _patterns(self, name: str) -> tuple[str, ...] | None:
        return self.commands.get(name) or (
            self.commands.get("bash") if name in SHELL_TOOLS else None)

    def check(self, tool: str, tool_input: Mapping[str, Any]) -> tuple[bool, str, str | None]:
        """(allowed, message, rule) for one call."""
        name = tool.lower()
        if name in self.tools:
            return True, f"{tool} is in scope", tool
        for alias in ALIASES.get(name, ()):
            if alias in self.tools:
                return True, f"{tool} is in scope (as {alias})", alias
        if rule := self._mcp_rule(name):
            return True, f"{tool} is in scope", rule
        patterns = self._patterns(name)
        if patterns:
            command = shell_command(tool_input)
            if command is None:
                return False, f"{tool} call without a command string", None
            verdict = check_scope(command, patterns)
            if verdict.allowed:
                return True, f"`{command}` is in scope", f"{tool}({' | '.join(patterns)})"
            return False, verdict.reason, None
        listed = ", ".join(self.rules) or "no tools"
        return False, f"{tool} is outside this role's tool scope (allowed: {listed})", None


def shell_command(tool_input: Mapping[str, Any]) -> str | None:
    """The command string of a shell tool call, in any CLI's spelling."""
    for key in ("command", "cmd"):
        value = tool_input.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            return shlex.join(value)  # argv form (Codex local_shell): exec'd as is
    return None


def decide(tool: str, tool_input: Mapping[str, Any], used: Usage, limits: Limits,
           scope: Scope) -> Decision:
    """The verdict on one tool call."""
    for limit, spent, budget in (("token_budget_in", used.tokens_in, limits.token_budget_in),
                                 ("token_budget_out", used.tokens_out, limits.token_budget_out)):
        if spent >= budget:
            return Decision(verdict="deny", reason=limit, limit=limit, message=(
                f"Corral: this run has used {spent} of its {budget} {limit} tokens. Do not call "
                "more tools; reply now with a short summary of what you did and what is left."))
    if used.tool_calls >= limits.max_tool_calls:
        return Decision(verdict="deny", reason="max_tool_calls", limit="max_tool_calls", message=(
            f"Corral: this run's tool-call budget ({limits.max_tool_calls}) is spent. Do not "
            "call more tools; reply now with a short summary of what you did and what is left."))
    allowed, message, rule = scope.check(tool, tool_input)
    if not allowed:
        return Decision(verdict="deny", reason="out_of_scope", message=f"Corral: {message}")
    return Decision(verdict="allow", reason="allowed", message=message, rule=rule)
