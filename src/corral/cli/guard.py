"""`corral guard check`: what would the guardrails say about this command or this SQL?

For operators writing rules. Prints the verdict, the reason code, the rule that decided and the
simple command it was about; ``--json`` for scripts. Exit status: 0 allow, 1 deny,
2 require_approval; bad input (an unreadable or invalid rules file, no command) is one line on
stderr with the usual error exit codes (2 for a configuration or request error — read the verdict
from stdout or ``--json`` when that matters).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from corral.domain.errors import ConfigError, CorralError, InvalidRequest
from corral.policy.guardrails import (
    STAGES,
    Guardrails,
    GuardVerdict,
    approval_digest,
    default_guardrails,
    load_rules,
)
from corral.policy.sql import DIALECTS

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Guardrails: per-role safety rules checked at spawn and at every tool "
                       "call. Try a command or SQL against them.")

EXIT = {"allow": 0, "deny": 1, "require_approval": 8}  # 2 is bad input (docs/reference/cli.md)


def _fail(err: CorralError) -> NoReturn:
    typer.echo(f"corral: error: {err}", err=True)
    raise typer.Exit(err.exit_code)


def rules_from(path: Path | None, defaults: bool = True) -> Guardrails:
    """The shipped defaults, with ``path``'s rules merged in front (or ``path``'s alone)."""
    try:
        base = default_guardrails() if defaults else Guardrails(roles={})
        return base if path is None else base.merged(load_rules(path))
    except ValueError as err:
        raise ConfigError(str(err)) from None


@app.command(context_settings={"allow_interspersed_args": False})
def check(
    command: Annotated[list[str] | None, typer.Argument(
        help="The command after `--`: one argument is a shell command line "
             "('kubectl get pods | head'); several are one program's argv.",
        show_default=False)] = None,
    role: Annotated[str, typer.Option(
        "--role", "-r", help="The agent role (`_all` rules apply to every role).")] = "default",
    rules: Annotated[Path | None, typer.Option(
        "--rules", help="A guardrails YAML file, merged in front of the shipped defaults.",
        show_default=False)] = None,
    no_defaults: Annotated[bool, typer.Option(
        "--no-defaults", help="Use only --rules, not the shipped defaults.")] = False,
    sql: Annotated[str | None, typer.Option(
        "--sql", help="Check this SQL with the role's first SQL rule instead of a command.",
        show_default=False)] = None,
    dialect: Annotated[str | None, typer.Option(
        "--dialect", help="SQL dialect for --sql (default: the rule's, else duckdb).",
        show_default=False)] = None,
    stage: Annotated[str, typer.Option(
        "--stage", help="spawn (the job's command) or tool_call.")] = "tool_call",
    tool: Annotated[str, typer.Option("--tool", help="The tool making the call.")] = "Bash",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Print the verdict on COMMAND (or --sql) for ROLE and the rule that decided it.

    Exit status: 0 allow, 1 deny, 2 require_approval.
    """
    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its parse warnings are not for users
    try:
        verdict = _decide(command, role, rules, no_defaults, sql, dialect, stage, tool)
    except CorralError as err:
        _fail(err)
    subject = verdict.approval_subject
    if as_json:
        typer.echo(json.dumps({
            "role": role, "stage": stage, "tool": tool if sql is None else "sql",
            "verdict": verdict.verdict, "reason": verdict.reason, "rule_id": verdict.rule_id,
            "command": verdict.command, "message": verdict.message,
            "approval_subject": subject,
            "approval_digest": approval_digest(subject) if subject is not None else None,
        }, indent=2, sort_keys=True))
    else:
        _print(verdict)
    raise typer.Exit(EXIT[verdict.verdict])


def _decide(command: list[str] | None, role: str, rules: Path | None, no_defaults: bool,
            sql: str | None, dialect: str | None, stage: str, tool: str) -> GuardVerdict:
    if stage not in STAGES:
        raise InvalidRequest(f"--stage must be spawn or tool_call, not {stage!r}")
    if dialect is not None and dialect not in DIALECTS:
        raise InvalidRequest(f"unknown SQL dialect {dialect!r} "
                             f"(known: {', '.join(sorted(DIALECTS))})")
    if no_defaults and rules is None:
        raise InvalidRequest("--no-defaults needs --rules FILE")
    if sql is not None and command:
        raise InvalidRequest("give either a command after `--` or --sql, not both")
    guard = rules_from(rules, defaults=not no_defaults)
    if sql is not None:
        if not sql.strip():
            raise InvalidRequest("--sql is empty")
        return guard.check_sql(role, sql, dialect)
    if not command:
        raise InvalidRequest("nothing to check: give a command after `--` (or --sql '…')")
    text: str | list[str] = command[0] if len(command) == 1 else list(command)
    if isinstance(text, str) and not text.strip():
        raise InvalidRequest("the command is empty")
    return guard.evaluate(role, stage, tool, {"command": text})


def _print(v: GuardVerdict) -> None:
    rule = v.rule_id or "(built-in)" if v.reason != "no_rule_matched" else "(none)"
    typer.echo(f"{v.verdict}  reason={v.reason}  rule={rule}")
    if v.command:
        typer.echo(f"  about:   {v.command}")
    typer.echo(f"  message: {v.message}")
    if v.approval_subject is not None:
        typer.echo(f"  approve: {v.approval_subject}")
        typer.echo(f"  digest:  sha256:{approval_digest(v.approval_subject)}")
