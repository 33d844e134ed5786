"""Tool scopes and runtime limits: may this tool call of a governed agent run?

A pure decision from the permit's budget, what the attempt has used so far, and the role's tool
scope. Order: token budgets, then the tool-call budget (both end the attempt: the call is denied
with a reason the agent can read, and the agent is stopped after a short grace), then the scope
(a denial the agent can recover from: it may try something in scope). The role's guardrails come
after (policy/toolcall.py puts the two together: the one decision the engine and `corral guard
check` both run).

Scope rules are Claude Code's notation, parsed: `Bash(kubectl *)` allows shell commands every
part of which matches a pattern (policy/shell.py parses the command the way the shell that runs
it will); a file tool takes a path pattern, `Read(./**)`, `Write(src/**)`, and a bare `Read` means
the workspace (policy/paths.py); a redirection in a shell command is a read or a write of its
target, allowed only where a `Read` (or `Write`/`Edit`) rule covers it; `mcp__server` allows
every tool of one MCP server and `mcp__server__tool` one of them; any other bare name allows
that tool. Tool names compare case-insensitively, so one scope serves every CLI (`Bash` in
Claude Code and Codex is `bash` in OpenCode).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.domain.agents import Verdict
from corral.domain.models import Limits
from corral.policy.paths import (
    FILE_TOOLS,
    WORKSPACE,
    PathAccess,
    PathPattern,
    PathUse,
    Place,
    Resolve,
    file_uses,
    outside,
    parse_path_pattern,
    real,
)
from corral.policy.shell import DIALECTS, check_scope, parse

SHELL_TOOLS = frozenset({"bash", "shell", "exec_command", "local_shell", "run_shell_command"})
# One scope for every CLI: the names a CLI uses for what a scope calls Edit/Write.
ALIASES = {
    "apply_patch": ("edit", "write"),
    "patch": ("edit", "write"),
    "multiedit": ("edit",),
    "list": ("glob", "ls"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What an attempt has used when it asks for its next tool call."""

    tool_calls: int  # calls allowed so far
    tokens_in: int
    tokens_out: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One tool call, and where it runs: the attempt's workspace (the job's working directory),
    the directory the CLI runs it in, the home `~` means there, and the shell that runs a
    command (``bash`` or ``sh``; any other is refused)."""

    tool: str
    input: Mapping[str, Any]
    workspace: str
    cwd: str | None = None
    home: str | None = None
    shell: str = "bash"
    problem: str | None = None  # why the engine cannot tell how the CLI will run this call

    @property
    def place(self) -> Place:
        return Place(self.workspace, self.cwd or self.workspace, self.home)


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
    paths: Mapping[str, tuple[PathPattern, ...]] = field(default_factory=dict)  # file tools
    mcp: frozenset[tuple[str, ...]] = frozenset()  # ("server",) or ("server", "tool"), lower
    mcp_rules: tuple[tuple[str, ...], ...] = ()  # the same, spelled as written
    rules: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rules: Sequence[str]) -> Scope:
        tools: set[str] = set()
        commands: dict[str, list[str]] = {}
        paths: dict[str, list[PathPattern]] = {}
        mcp: list[tuple[str, ...]] = []
        for rule in rules:
            rule = rule.strip()
            name, _, rest = rule.partition("(")
            name = name.strip()
            if not name:
                raise ValueError(f"tool scope rule {rule!r} names no tool")
            if rest and not rest.endswith(")"):
                raise ValueError(f"tool scope rule {rule!r}: missing `)`")
            spec = rest[:-1].strip() if rest else ""
            if rest and not spec:
                raise ValueError(
                    f"tool scope rule {rule!r}: empty `()`; name a pattern or write {name} alone"
                )
            if name.lower() in FILE_TOOLS:
                try:
                    paths.setdefault(name.lower(), []).append(parse_path_pattern(spec or WORKSPACE))
                except ValueError as err:
                    raise ValueError(f"tool scope rule {rule!r}: {err}") from None
            elif rest:
                commands.setdefault(name.lower(), []).append(spec)
            elif name.lower().startswith("mcp__"):
                parts = tuple(p for p in name.split("__")[1:] if p)
                if not 1 <= len(parts) <= 2:
                    raise ValueError(
                        f"tool scope rule {rule!r}: use mcp__server or mcp__server__tool"
                    )
                mcp.append(parts)
            else:
                tools.add(name.lower())
        return cls(
            tools=frozenset(tools),
            commands={k: tuple(v) for k, v in commands.items()},
            paths={k: tuple(v) for k, v in paths.items()},
            mcp=frozenset(tuple(p.lower() for p in parts) for parts in mcp),
            mcp_rules=tuple(mcp),
            rules=tuple(rules),
        )

    def offers(self, tool: str) -> bool:
        """Whether some call of `tool` can be in scope: a CLI that can hide the other tools from
        the model hides them (the call-by-call check still decides each call)."""
        name = tool.lower()
        return (
            name in self.tools
            or any(a in self.tools for a in ALIASES.get(name, ()))
            or self._file_patterns(name) is not None
            or self._mcp_rule(name) is not None
            or bool(self._patterns(name))
        )

    def offers_server(self, server: str) -> bool:
        """Whether some tool of the MCP server `server` can be in scope."""
        return any(allowed[0] == server.lower() for allowed in self.mcp)

    def _mcp_rule(self, name: str) -> str | None:
        if not name.startswith("mcp__"):
            return None
        parts = tuple(p for p in name.split("__")[1:] if p)
        for allowed in self.mcp:
            if parts[: len(allowed)] == allowed and len(parts) >= len(allowed):
                return "mcp__" + "__".join(allowed)
        return None

    def _patterns(self, name: str) -> tuple[str, ...] | None:
        return self.commands.get(name) or (
            self.commands.get("bash") if name in SHELL_TOOLS else None
        )

    def _file_patterns(self, name: str) -> tuple[PathPattern, ...] | None:
        """The path patterns a file tool's calls are held to (its own and its aliases')."""
        found = [p for n in (name, *ALIASES.get(name, ())) for p in self.paths.get(n, ())]
        return tuple(found) if found or name in self.paths else None

    def redirect_patterns(self, access: PathAccess) -> tuple[PathPattern, ...]:
        """Where a shell redirection may read (`Read` rules) or write (`Write`, `Edit`)."""
        if access == "read":
            return self.paths.get("read", ())
        return (*self.paths.get("write", ()), *self.paths.get("edit", ()))

    def check(self, call: Call, resolve: Resolve = real) -> tuple[bool, str, str | None]:
        """(allowed, message, rule) for one call."""
        tool, name = call.tool, call.tool.lower()
        if name in self.tools:
            return True, f"{tool} is in scope", tool
        for alias in ALIASES.get(name, ()):
            if alias in self.tools:
                return True, f"{tool} is in scope (as {alias})", alias
        if name in FILE_TOOLS and (paths := self._file_patterns(name)) is not None:
            return self._check_file(call, paths, resolve)
        if rule := self._mcp_rule(name):
            return True, f"{tool} is in scope", rule
        if patterns := self._patterns(name):
            return self._check_shell(call, patterns, resolve)
        listed = ", ".join(self.rules) or "no tools"
        return False, f"{tool} is outside this role's tool scope (allowed: {listed})", None

    def _check_file(
        self, call: Call, patterns: tuple[PathPattern, ...], resolve: Resolve
    ) -> tuple[bool, str, str | None]:
        uses, problem = file_uses(call.tool, call.input)
        if problem is not None:
            return False, problem, None
        miss = outside(uses, lambda _access: patterns, call.place, resolve)
        if miss is not None:
            return False, miss[1], None
        rule = f"{call.tool}({' | '.join(p.source for p in patterns)})"
        return True, f"{call.tool} of {', '.join(u.path for u in uses)} is in scope", rule

    def _check_shell(
        self, call: Call, patterns: tuple[str, ...], resolve: Resolve
    ) -> tuple[bool, str, str | None]:
        command = shell_command(call.input)
        if command is None:
            return False, f"{call.tool} call without a command string", None
        if call.shell not in DIALECTS:
            return (
                False,
                (
                    f"this command would run under {call.shell}, which Corral does not "
                    "model (bash and sh only)"
                ),
                None,
            )
        if call.input.get("run_in_background") is True:  # Claude Code's own way to detach
            command = "{ " + command + "\n} &"
        verdict = check_scope(command, patterns, call.shell)
        if not verdict.allowed:
            return False, verdict.reason, None
        parsed = parse(command, call.shell)
        if parsed.changes_dir and any(
            not r.target.startswith(("/", "~")) for r in parsed.redirects
        ):
            return (
                False,
                (
                    "a relative redirection after `cd`: which file it opens depends on "
                    "where the command has moved; use an absolute path"
                ),
                None,
            )
        uses = [
            PathUse(r.target, r.access, f"`{r.operator}` redirection") for r in parsed.redirects
        ]
        miss = outside(uses, self.redirect_patterns, call.place, resolve)
        if miss is not None:
            return False, f"the {miss[0].what} to {miss[1]}", None
        return True, f"`{command}` is in scope", f"{call.tool}({' | '.join(patterns)})"


def shell_command(tool_input: Mapping[str, Any]) -> str | None:
    """The command string of a shell tool call, in any CLI's spelling."""
    for key in ("command", "cmd"):
        value = tool_input.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            return shlex.join(value)  # argv form (Codex local_shell): exec'd as is
    return None


def token_limit(used: Usage, limits: Limits) -> Decision | None:
    """A token budget the attempt has spent (input first), if any."""
    for limit, spent, budget in (
        ("token_budget_in", used.tokens_in, limits.token_budget_in),
        ("token_budget_out", used.tokens_out, limits.token_budget_out),
    ):
        if spent >= budget:
            return Decision(
                verdict="deny",
                reason=limit,
                limit=limit,
                message=(
                    f"Corral: this run has used {spent} of its {budget} {limit} tokens. "
                    "Do not call more tools; reply now with a short summary of what you did and "
                    "what is left."
                ),
            )
    return None


def call_limit(used: Usage, limits: Limits) -> Decision | None:
    """The tool-call budget, when the attempt has spent it."""
    if used.tool_calls < limits.max_tool_calls:
        return None
    return Decision(
        verdict="deny",
        reason="max_tool_calls",
        limit="max_tool_calls",
        message=(
            f"Corral: this run's tool-call budget ({limits.max_tool_calls}) is spent. Do not "
            "call more tools; reply now with a short summary of what you did and what is left."
        ),
    )


def in_scope(call: Call, scope: Scope, resolve: Resolve = real) -> Decision:
    """The scope's verdict on one call: allowed (naming the rule) or out of scope."""
    if call.problem is not None:
        return Decision(verdict="deny", reason="out_of_scope", message=f"Corral: {call.problem}")
    allowed, message, rule = scope.check(call, resolve)
    if not allowed:
        return Decision(verdict="deny", reason="out_of_scope", message=f"Corral: {message}")
    return Decision(verdict="allow", reason="allowed", message=message, rule=rule)


def decide(
    call: Call, used: Usage, limits: Limits, scope: Scope, resolve: Resolve = real
) -> Decision:
    """The verdict of budgets and scope on one tool call: the first three steps of the
    tool-call decision (policy/toolcall.py), without the role's guardrails."""
    return token_limit(used, limits) or call_limit(used, limits) or in_scope(call, scope, resolve)
