"""`corral guard check`: what would the engine decide on this tool call, command or SQL?

For operators writing scopes and rules. A tool call (the default stage) gets exactly the engine's
decision for an agent of the role (policy/toolcall.py): its tool scope — the command, the paths
it touches, the shell that runs it — then its guardrails, with the role's scope and rules read
from the configuration like every other command does. It prints the verdict, the reason code,
the rule and which part decided (``by=budget|scope|guardrail``); ``--json`` for scripts. Exit
status: 0 allow, 1 deny, 8 require_approval (docs/reference/cli.md); bad input — an unknown
role, an unreadable or invalid rules file, no command — is one line on stderr with exit 2.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli.exits import fail
from corral.cli.options import ConfigOpt, DataDir
from corral.config import guardrails_of
from corral.config import load as load_config
from corral.domain.errors import ConfigError, CorralError, InvalidRequest
from corral.domain.settings import RoleSpec, Settings
from corral.policy import toolcall
from corral.policy.guardrails import (
    STAGES,
    Guardrails,
    GuardVerdict,
    approval_digest,
    default_guardrails,
    load_rules,
)
from corral.policy.scopes import SHELL_TOOLS, Call, Scope, Usage
from corral.policy.shell import DIALECTS as SHELLS
from corral.policy.sql import DIALECTS

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Guardrails and tool scopes: try a tool call, a command or SQL against "
    "what the engine would decide for a role.",
)

EXIT = {"allow": 0, "deny": 1, "require_approval": 8}  # 2 is bad input (docs/reference/cli.md)


def rules_from(
    path: Path | None, defaults: bool = True, base: Guardrails | None = None
) -> Guardrails:
    """``base`` (the shipped defaults) with ``path``'s rules merged in front (or ``path``'s
    alone)."""
    try:
        start = (base or default_guardrails()) if defaults else Guardrails(roles={})
        return start if path is None else start.merged(load_rules(path))
    except ValueError as err:
        raise ConfigError(str(err)) from None


@app.command(context_settings={"allow_interspersed_args": False})
def check(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The command after `--`: one argument is a shell command line "
            "('kubectl get pods | head'); several are one program's argv.",
            show_default=False,
        ),
    ] = None,
    role: Annotated[
        str, typer.Option("--role", "-r", help="The agent role, as configured (corral.yaml).")
    ] = "default",
    tool: Annotated[
        str,
        typer.Option(
            "--tool",
            help="The tool making the call (Bash, Read, Write, apply_patch, mcp__server__tool …).",
        ),
    ] = "Bash",
    tool_input: Annotated[
        str | None,
        typer.Option(
            "--input",
            help="The call's input as JSON, for a tool other than a shell "
            '(\'{"file_path": "/etc/passwd"}\').',
            show_default=False,
        ),
    ] = None,
    cwd: Annotated[
        Path | None,
        typer.Option(
            "--cwd",
            help="The job's working directory: the workspace relative paths and path "
            "scopes are in (default: the current directory).",
            show_default=False,
        ),
    ] = None,
    shell: Annotated[
        str,
        typer.Option("--shell", help="The shell that runs the command: bash, or sh (POSIX; dash)."),
    ] = "bash",
    rules: Annotated[
        Path | None,
        typer.Option(
            "--rules",
            help="A guardrails YAML file, merged in front of the configured ones.",
            show_default=False,
        ),
    ] = None,
    no_defaults: Annotated[
        bool,
        typer.Option(
            "--no-defaults", help="Use only --rules, not the shipped or configured guardrails."
        ),
    ] = False,
    sql: Annotated[
        str | None,
        typer.Option(
            "--sql",
            help="Check this SQL with the role's first SQL rule instead of a call.",
            show_default=False,
        ),
    ] = None,
    dialect: Annotated[
        str | None,
        typer.Option(
            "--dialect",
            help="SQL dialect for --sql (default: the rule's, else duckdb).",
            show_default=False,
        ),
    ] = None,
    stage: Annotated[
        str,
        typer.Option(
            "--stage",
            help="tool_call (an agent's call: scope, then guardrails) or spawn (a "
            "command job's command: guardrails only).",
        ),
    ] = "tool_call",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Print the engine's verdict on a tool call (COMMAND, or --tool with --input) of ROLE, the
    reason, the rule and which part decided; or on --sql.

    Exit status: 0 allow, 1 deny, 8 require_approval; 2 for bad input.
    """
    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its parse warnings are not for users
    try:
        out = _decide(
            _Request(
                command=command,
                role=role,
                tool=tool,
                tool_input=tool_input,
                cwd=cwd,
                shell=shell,
                rules=rules,
                no_defaults=no_defaults,
                sql=sql,
                dialect=dialect,
                stage=stage,
            ),
            data_dir,
            config,
        )
    except CorralError as err:
        fail(err)
    if as_json:
        typer.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        _print(out)
    raise typer.Exit(EXIT[out["verdict"]])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    command: list[str] | None
    role: str
    tool: str
    tool_input: str | None
    cwd: Path | None
    shell: str
    rules: Path | None
    no_defaults: bool
    sql: str | None
    dialect: str | None
    stage: str


def _decide(r: _Request, data_dir: Path | None, config: Path | None) -> dict[str, Any]:
    _validate(r)
    settings = load_config(data_dir=data_dir, config_path=config).settings
    guard = rules_from(r.rules, defaults=not r.no_defaults, base=guardrails_of(settings))
    if r.sql is not None:
        return _guard_json(r, guard.check_sql(r.role, r.sql, r.dialect), "sql")
    if r.stage == "spawn":
        found = guard.spawn_check(r.role, _command(r))
        if found is None:
            return {
                "role": r.role,
                "stage": "spawn",
                "tool": r.tool,
                "verdict": "allow",
                "reason": "no_rule_matched",
                "rule_id": None,
                "decided_by": "guardrail",
                "command": None,
                "approval_subject": None,
                "approval_digest": None,
                "message": f"role {r.role!r} has no guardrails of its own: its command "
                "jobs are not checked at spawn",
            }
        return _guard_json(r, found, r.tool)
    role = _role(settings, r.role)
    workspace = os.path.abspath(r.cwd or Path.cwd())
    call = Call(
        tool=r.tool,
        input=_input(r),
        workspace=workspace,
        cwd=workspace,
        home=str(Path.home()),
        shell=r.shell,
    )
    v = toolcall.decide(
        call,
        role=role.name,
        scope=Scope.parse(role.tools),
        guardrails=guard,
        used=Usage(tool_calls=0, tokens_in=0, tokens_out=0),
        limits=role.limits,
    )
    subject = v.approval_subject
    return {
        "role": r.role,
        "stage": r.stage,
        "tool": r.tool,
        "verdict": v.verdict,
        "reason": v.reason,
        "decided_by": v.decided_by,
        "rule_id": v.rule if v.decided_by == "guardrail" else v.guardrail,
        "scope_rule": v.rule if v.decided_by == "scope" else None,
        "command": v.command,
        "message": v.message,
        "approval_subject": subject,
        "approval_digest": approval_digest(subject) if subject is not None else None,
        "shell": r.shell,
        "cwd": workspace,
    }


def _validate(r: _Request) -> None:
    if r.stage not in STAGES:
        raise InvalidRequest(f"--stage must be spawn or tool_call, not {r.stage!r}")
    if r.dialect is not None and r.dialect not in DIALECTS:
        raise InvalidRequest(
            f"unknown SQL dialect {r.dialect!r} (known: {', '.join(sorted(DIALECTS))})"
        )
    if r.shell not in SHELLS:
        raise InvalidRequest(
            f"--shell must be bash or sh, not {r.shell!r} (Corral models "
            "only those; an agent's call under another shell is denied)"
        )
    if r.no_defaults and r.rules is None:
        raise InvalidRequest("--no-defaults needs --rules FILE")
    if r.sql is not None and (r.command or r.tool_input is not None):
        raise InvalidRequest(
            "give either a call (a command after `--`, or --input) or --sql, not both"
        )
    if r.sql is not None and not r.sql.strip():
        raise InvalidRequest("--sql is empty")
    if r.command and r.tool_input is not None:
        raise InvalidRequest("give either a command after `--` or --input, not both")


def _role(settings: Settings, name: str) -> RoleSpec:
    role = settings.roles.get(name)
    if role is None:
        known = ", ".join(sorted(settings.roles)) or "none"
        raise InvalidRequest(f"unknown role {name!r} (configured: {known})")
    return role


def _command(r: _Request) -> str | list[str]:
    if not r.command:
        raise InvalidRequest("nothing to check: give a command after `--` (or --input, --sql)")
    text: str | list[str] = r.command[0] if len(r.command) == 1 else list(r.command)
    if isinstance(text, str) and not text.strip():
        raise InvalidRequest("the command is empty")
    return text


def _input(r: _Request) -> dict[str, Any]:
    if r.tool_input is None:
        if r.tool.lower() not in SHELL_TOOLS:
            raise InvalidRequest(f"a {r.tool} call needs --input '{{…}}' (JSON)")
        return {"command": _command(r)}
    try:
        data = json.loads(r.tool_input)
    except ValueError as err:
        raise InvalidRequest(f"--input is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("--input must be a JSON object")
    return data


def _guard_json(r: _Request, v: GuardVerdict, tool: str) -> dict[str, Any]:
    subject = v.approval_subject
    return {
        "role": r.role,
        "stage": r.stage,
        "tool": tool,
        "verdict": v.verdict,
        "reason": v.reason,
        "rule_id": v.rule_id,
        "decided_by": "guardrail",
        "command": v.command,
        "message": v.message,
        "approval_subject": subject,
        "approval_digest": approval_digest(subject) if subject is not None else None,
    }


def _print(out: dict[str, Any]) -> None:
    rule = (
        out.get("rule_id")
        or out.get("scope_rule")
        or (
            "(built-in)"
            if out["decided_by"] == "guardrail" and out["reason"] != "no_rule_matched"
            else "(none)"
        )
    )
    typer.echo(f"{out['verdict']}  reason={out['reason']}  rule={rule}  by={out['decided_by']}")
    if out.get("scope_rule") and out.get("rule_id"):
        typer.echo(f"  scope:   {out['scope_rule']}")
    if out.get("command"):
        typer.echo(f"  about:   {out['command']}")
    typer.echo(f"  message: {out['message']}")
    if out.get("approval_subject") is not None:
        typer.echo(f"  approve: {out['approval_subject']}")
        typer.echo(f"  digest:  sha256:{out['approval_digest']}")
