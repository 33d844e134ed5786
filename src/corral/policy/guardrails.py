"""Guardrails: per-role safety rules, as data, evaluated at spawn and at every tool call.

Tool scope (policy/scopes.py) says which tools and programs a role may use at all; guardrails say
how it may use them: which subcommands, options, namespaces and SQL statements are refused or need
a human. `Guardrails.evaluate(role, stage, tool, tool_input)` is pure and returns a
`GuardVerdict`: ``allow`` / ``deny`` / ``require_approval``, a machine reason code and the id of
the rule that decided.

Rule file (YAML)::

    version: 1                       # optional
    programs:                        # option grammars, so options are parsed, never grepped
      kubectl:
        valued: [-n, --namespace, --context]   # options that take a value
        flags: [-A, --all]                     # known value-less options (optional)
        single_dash: false           # true: `-word` is one option (duckdb -readonly, -cmd)
        aliases: [kubectl.exe]       # other program names meaning this one
    roles:
      notebook:                      # a role name from corral.yaml; `_all` applies to every role
        - id: no-delete-running      # unique within the role
          when:                      # every condition given must hold (lists: any item)
            tool: Bash               # tool name or fnmatch glob, case-insensitive; `Bash` means
                                     #   any shell tool (bash, shell, exec_command …); default any
            stage: tool_call         # spawn | tool_call; default both
            command: "kubectl delete *"   # policy/shell.py patterns over the *positional* words
            option: [--all, -A]      # any of these options present (parsed)
            option_value: {-n: [kube-system], --namespace: [kube-system]}   # fnmatch on values
            env: [KUBECONFIG]        # a NAME=… assignment of these anywhere in the input
            input: {file_path: ["/etc/*"]}  # fnmatch on string fields of a non-shell tool call
          verdict: deny              # allow | deny | require_approval
          reason: destructive_on_running_jobs   # snake_case machine code
          message: "…"               # optional, for the agent and the operator
          force_flags: [--force]     # optional: flags that are explicitly NOT consent
          sql:                       # optional: the verdict comes from policy/sql.py instead
            dialect: duckdb
            protected: ["prod.*"]
            options: [-c, -s, -cmd]  # options whose value is SQL
            operands: true           # positional words are SQL (after the database operand)
            database_operand: true   # the first positional word is the database (its stem is
                                     #   the default catalog: `duckdb prod.duckdb …` → `prod`)
            database_options: [-d]   # options naming the database (psql -d prod)
            input_keys: [query]      # non-shell tools: input fields holding SQL
            catalog: lake            # the default catalog when the command names no database
            search_path: [prod, public]   # schemas (or catalog.schema) unqualified names are in
            read_only: true          # only reads: writes, SET, USE, BEGIN READ WRITE denied

Evaluation of a shell command: it is parsed with `policy.shell.parse`; any problem (an expansion,
a syntax error, a construct the parser cannot account for) → deny ``unverifiable_command``. Each
simple command the shell would run — wrappers (``sh -c``, ``env``, ``xargs``, ``sudo`` …) peeled —
is split into its program (base name, aliases resolved), its options (``--context=x``,
``--context x``, ``-nprod``, ``-n prod``, clusters ``-fy``) and its positional words, using the
program's grammar plus every option a rule gives a value for. ``command`` patterns match the
positional words only, so options before a subcommand change nothing (``kubectl -n x delete pod
y`` is ``kubectl delete pod y``); pattern words must therefore not be options — use ``option``.
A word after an option the grammar does not know may be that option's value or a positional word:
deny and require_approval rules match if either reading matches; allow rules match only commands
without such ambiguity.

The role's rules and the ``_all`` rules are two independent lists; in each, the first rule that
matches a command decides it. The strictest verdict over every command and both lists wins (deny >
require_approval > allow), so a role's allow rule can never lift an ``_all`` denial. No rule
matching → allow ``no_rule_matched``.

A flag an agent types is never consent: an allow rule whose conditions mention ``--force``,
``--yes``, ``-y``, ``force=true`` … (or a rule's ``force_flags``) is refused when the file is
loaded, so no flag can turn a require_approval into allow. A require_approval verdict carries
``approval_subject`` — the exact command (the input text, stripped; an argv list shlex-joined) —
which a human approves; `approval_digest` is its SHA-256.

SQL rules: when ``when`` matches, the SQL is taken from the named options / operands / input
fields and judged by `policy.sql.check_sql`; the strictest statement verdict is the rule's. No
inline SQL (stdin, a file, ``-init``) → deny ``unverifiable_sql``. For duckdb/sqlite a text that is
a CLI dot-command is allowed only for read-only ones (``.tables``, ``.schema`` …).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from corral.domain.bounds import yaml_too_deep
from corral.domain.governance import approval_digest  # the record's; named here for callers
from corral.policy.scopes import SHELL_TOOLS, shell_command
from corral.policy.shell import DIALECTS as SHELLS
from corral.policy.shell import Pattern, SimpleCommand, parse, parse_pattern
from corral.policy.sql import DIALECTS, check_sql

__all__ = [
    "ALL_ROLES",
    "EPIC_WORKER",
    "FORCE_WORDS",
    "STAGES",
    "STRICTNESS",
    "GuardVerdict",
    "Guardrails",
    "Program",
    "Rule",
    "SqlSource",
    "When",
    "approval_digest",
    "default_guardrails",
    "load_rules",
]

GuardVerdictKind = Literal["allow", "deny", "require_approval"]
STAGES = ("spawn", "tool_call")
ALL_ROLES = "_all"
# Applied besides its role's rules to an agent an epic ignites (services/epics.py): the lead,
# Corral, commits its work; the worker may not commit or push.
EPIC_WORKER = "_epic_worker"
FORCE_WORDS = frozenset(
    {"--force", "--yes", "-y", "--assume-yes", "force=true", "--force=true", "--confirm",
     "--no-confirm", "--no-prompt", "--non-interactive", "--auto-approve", "--i-am-sure"}
)  # fmt: skip
"""Words that signal consent in some CLI; no allow rule may depend on them."""

_RANK = {"allow": 0, "require_approval": 1, "deny": 2}
STRICTNESS: dict[str, int] = _RANK  # deny > require_approval > allow
_VERDICTS = frozenset(_RANK)
_REASON = re.compile(r"[a-z][a-z0-9_]*\Z")
_RULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*\Z")
_ENV_ASSIGN = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)\+?=")
_READ_ONLY_DOT = frozenset(
    {".tables", ".schema", ".databases", ".indexes", ".indices", ".help", ".show", ".mode",
     ".headers", ".width", ".timer", ".columns", ".maxrows", ".maxwidth", ".fullschema"}
)  # fmt: skip

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster


MEMO_SIZE = 4096  # verdicts remembered per rule set (cleared when full)


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    verdict: GuardVerdictKind
    reason: str  # machine code: no_rule_matched | unverifiable_command | a rule's reason | sql_…
    rule_id: str | None  # the rule that decided; None for the built-in checks
    message: str
    approval_subject: str | None = None  # set for require_approval: exactly what a human approves
    command: str | None = None  # the simple command (or SQL) the verdict is about


@dataclass(frozen=True, slots=True)
class Program:
    """How one program reads its options."""

    valued: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    single_dash: bool = False
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SqlSource:
    dialect: str
    protected: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    operands: bool = False
    database_operand: bool = False
    database_options: tuple[str, ...] = ()
    input_keys: tuple[str, ...] = ()
    catalog: str | None = None
    search_path: tuple[str, ...] = ()
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class When:
    tools: tuple[str, ...] = ()  # lower-case names or globs; () = any tool
    stages: frozenset[str] = frozenset(STAGES)
    commands: tuple[Pattern, ...] = ()
    options: frozenset[str] = frozenset()
    option_values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    env: frozenset[str] = frozenset()
    input: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def needs_command(self) -> bool:
        return bool(self.commands or self.options or self.option_values or self.env)


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    when: When
    verdict: GuardVerdictKind | None  # None: an SQL rule, the SQL checker decides
    reason: str
    message: str | None = None
    sql: SqlSource | None = None
    force_flags: frozenset[str] = frozenset()
    where: str = ""  # "roles.notebook[1]", for messages


# --------------------------------------------------------------------------------------------
# Words of one command: program, options, positionals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Words:
    program: str
    positionals: tuple[tuple[str, bool], ...]  # (word, may be an unknown option's value)
    options: tuple[tuple[str, str | None], ...]
    ambiguous: bool


def _program_name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _split(argv: Sequence[str], grammar: Program, program: str) -> _Words:
    positionals: list[tuple[str, bool]] = []
    options: list[tuple[str, str | None]] = []
    maybe_value = False
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            positionals.extend((w, False) for w in argv[i + 1 :])
            break
        if len(word) > 1 and word.startswith("-"):
            i, maybe_value = _option(argv, i, grammar, options)
            continue
        positionals.append((word, maybe_value))
        maybe_value = False
        i += 1
    ambiguous = any(m for _, m in positionals)
    return _Words(program, tuple(positionals), tuple(options), ambiguous)


def _option(
    argv: Sequence[str], i: int, grammar: Program, out: list[tuple[str, str | None]]
) -> tuple[int, bool]:
    """Read the option at ``argv[i]``: (next index, next word may be its value)."""
    word = argv[i]
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    if word.startswith("--") or grammar.single_dash:
        name, eq, value = word.partition("=")
        if eq:
            out.append((name, value))
            return i + 1, False
        if name in grammar.valued:
            out.append((name, nxt))
            return i + 2, False
        out.append((name, None))
        return i + 1, name not in grammar.flags
    for k, ch in enumerate(word[1:], start=1):
        name = "-" + ch
        if name in grammar.valued:
            rest = word[k + 1 :]
            if rest:
                out.append((name, rest[1:] if rest.startswith("=") else rest))
                return i + 1, False
            out.append((name, nxt))
            return i + 2, False
        out.append((name, None))
    return i + 1, "-" + word[-1] not in grammar.flags


def _pattern_matches(pattern: Pattern, words: _Words, strict: bool) -> bool:
    if pattern.words[0] != words.program:
        return False
    pats = pattern.words[1:]
    pos = words.positionals
    if not words.ambiguous:  # the common case: one reading
        if len(pos) < len(pats) or (not pattern.rest and len(pos) != len(pats)):
            return False
        return all(_word_matches(p, w) for p, (w, _) in zip(pats, pos, strict=False))
    if strict:
        return False
    return _match_either_way(pats, pattern.rest, pos)


def _match_either_way(pats: Sequence[str], rest: bool, pos: Sequence[tuple[str, bool]]) -> bool:
    """Match where each word marked "maybe an option's value" may also be skipped."""
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        key = (i, j)
        if key not in memo:
            if j == len(pats):
                memo[key] = rest or all(m for _, m in pos[i:])
            elif i == len(pos):
                memo[key] = False
            else:
                word, maybe = pos[i]
                memo[key] = (maybe and match(i + 1, j)) or (
                    _word_matches(pats[j], word) and match(i + 1, j + 1)
                )
        return memo[key]

    return match(0, 0)


def _word_matches(pattern_word: str, word: str) -> bool:
    if any(c in pattern_word for c in "*?["):
        return fnmatch.fnmatchcase(word, pattern_word)
    return pattern_word == word


def _glob_any(value: str, globs: Iterable[str]) -> bool:
    low = value.lower()
    return any(fnmatch.fnmatchcase(low, g) for g in globs)


# --------------------------------------------------------------------------------------------
# The rule set
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Outcome:
    verdict: GuardVerdictKind
    reason: str
    rule: Rule | None
    message: str
    command: str | None


@dataclass(frozen=True)
class Guardrails:
    """Rules per role, parsed and checked. Build with `load_rules` / `default_guardrails`."""

    roles: Mapping[str, tuple[Rule, ...]]
    programs: Mapping[str, Program] = field(default_factory=dict)
    _grammars: dict[str, Program] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _aliases: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _index: dict[tuple[int, str], tuple[Rule, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _memo: dict[tuple[str, str, str, str, str], GuardVerdict] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._aliases.update(_aliases(self.programs))

    # -- public ------------------------------------------------------------------------------

    def merged(self, override: Guardrails) -> Guardrails:
        """``override``'s rules first in each role (a rule with a default's id replaces it);
        its program grammars replace the defaults' of the same name."""
        roles: dict[str, tuple[Rule, ...]] = {}
        for role in dict.fromkeys([*override.roles, *self.roles]):
            mine = override.roles.get(role, ())
            ids = {r.id for r in mine}
            roles[role] = (*mine, *(r for r in self.roles.get(role, ()) if r.id not in ids))
        return Guardrails(roles=roles, programs={**self.programs, **override.programs})

    def rules_for(self, role: str) -> tuple[tuple[Rule, ...], ...]:
        lists = [self.roles.get(role, ())] if role != ALL_ROLES else []
        return (*lists, self.roles.get(ALL_ROLES, ()))

    def evaluate(
        self,
        role: str,
        stage: str,
        tool: str,
        tool_input: Mapping[str, Any],
        shell: str = "bash",
    ) -> GuardVerdict:
        """The verdict on one tool call (stage ``tool_call``) or one job's command (``spawn``);
        a shell command is read as ``shell`` (``bash`` or ``sh``) would run it.

        Pure, so memoised per (role, stage, tool, input, shell): agents repeat their polling
        commands, and a repeat costs a dictionary lookup instead of a parse and a rule walk."""
        key = (role, stage, tool, json.dumps(tool_input, sort_keys=True, default=str), shell)
        found = self._memo.get(key)
        if found is None:
            found = self._evaluate(role, stage, tool, tool_input, shell)
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = found
        return found

    def _evaluate(
        self, role: str, stage: str, tool: str, tool_input: Mapping[str, Any], shell: str
    ) -> GuardVerdict:
        if stage not in STAGES:
            raise ValueError(f"unknown guardrail stage {stage!r} (use spawn or tool_call)")
        lists = self.rules_for(role)
        if tool.lower() in SHELL_TOOLS:
            command = shell_command(tool_input)
            if command is None:
                return GuardVerdict(
                    "deny",
                    "unverifiable_command",
                    None,
                    f"Corral guardrail: {tool} call without a command string",
                )
            if shell not in SHELLS:
                return GuardVerdict(
                    "deny",
                    "unverifiable_command",
                    None,
                    f"Corral guardrail: commands run by {shell} cannot be "
                    "checked (Corral models bash and sh)",
                )
            outcome = self._shell(lists, stage, tool, tool_input, command, shell)
            return _verdict(outcome, command)
        outcome = self._other(lists, stage, tool, tool_input)
        subject = f"{tool} {json.dumps(tool_input, sort_keys=True, ensure_ascii=False)}"
        return _verdict(outcome, subject)

    def spawn_check(self, role: str, command: str | Sequence[str]) -> GuardVerdict | None:
        """The guardrails on a command job's command before it runs (stage ``spawn``); None
        when ``role`` has no rules of its own: an operator's `sh -c '… $VAR …'` in a plain role
        is not an agent's unverifiable tool call."""
        if not self.roles.get(role):
            return None
        text = command if isinstance(command, str) else shlex.join(command)
        return self.evaluate(role, "spawn", "Bash", {"command": text})

    def check_sql(self, role: str, sql: str, dialect: str | None = None) -> GuardVerdict:
        """Judge one SQL text with the first SQL rule of ``role`` (or ``_all``), for operators."""
        rule = next((r for rules in self.rules_for(role) for r in rules if r.sql), None)
        src = rule.sql if rule is not None and rule.sql else SqlSource(dialect or "duckdb")
        if dialect:
            src = replace(src, dialect=dialect)
        outcome = _sql_outcome([sql], src, rule, None, sql.strip())
        return _verdict(outcome, sql.strip())

    # -- shell -------------------------------------------------------------------------------

    def _shell(
        self,
        lists: Sequence[Sequence[Rule]],
        stage: str,
        tool: str,
        tool_input: Mapping[str, Any],
        command: str,
        shell: str,
    ) -> _Outcome:
        parsed = parse(command, shell)
        if parsed.problems:
            more = f" (and {len(parsed.problems) - 1} more)" if len(parsed.problems) > 1 else ""
            return _Outcome(
                "deny",
                "unverifiable_command",
                None,
                f"cannot verify this command: {parsed.problems[0]}{more}",
                None,
            )
        env = frozenset(_ENV_ASSIGN.findall(command)) if "=" in command else frozenset()
        worst = _Outcome("allow", "no_rule_matched", None, "no guardrail applies", None)
        allowed_by: _Outcome | None = None
        for cmd in parsed.commands:
            words = self._words(cmd)
            for rules in lists:
                candidates = self._candidates(rules, words.program)
                outcome = self._first(candidates, stage, tool, tool_input, cmd, words, env)
                if outcome is None:
                    continue
                if _RANK[outcome.verdict] > _RANK[worst.verdict]:
                    worst = outcome
                    if worst.verdict == "deny":
                        return worst
                elif outcome.verdict == "allow" and allowed_by is None:
                    allowed_by = outcome
        if worst.verdict == "allow" and parsed.holds:  # built in: a human approves these
            hold = parsed.holds[0]
            return _Outcome("require_approval", hold.reason, None, hold.message, command)
        return allowed_by if worst.verdict == "allow" and allowed_by is not None else worst

    def _candidates(self, rules: Sequence[Rule], program: str) -> tuple[Rule, ...]:
        """The rules of one list that may match a command of ``program``, in file order."""
        key = (id(rules), program)
        found = self._index.get(key)
        if found is None:
            found = tuple(
                r
                for r in rules
                if not r.when.commands or any(p.words[0] == program for p in r.when.commands)
            )
            self._index[key] = found
        return found

    def _first(
        self,
        rules: Sequence[Rule],
        stage: str,
        tool: str,
        tool_input: Mapping[str, Any],
        cmd: SimpleCommand,
        words: _Words,
        env: frozenset[str],
    ) -> _Outcome | None:
        appended = any(w == "xargs" or w.endswith(" +") for w in cmd.wrappers)
        for rule in rules:
            if not _tool_stage_input(rule, stage, tool, tool_input):
                continue
            if not _command_matches(rule, words, env):
                if appended and rule.verdict != "allow" and _may_match(rule, words, env):
                    text = shlex.join(cmd.argv)
                    return _Outcome(
                        "deny",
                        "unverifiable_command",
                        rule,
                        f"words appended at run time (xargs, find -exec … +) to "
                        f"`{text}` could make it {rule.reason}",
                        text,
                    )
                continue
            text = shlex.join(cmd.argv)
            if rule.sql is not None:
                return self._shell_sql(rule, rule.sql, words, text)
            return _rule_outcome(rule, words, text)
        return None

    def _shell_sql(self, rule: Rule, src: SqlSource, words: _Words, text: str) -> _Outcome:
        texts = [v for name, v in words.options if name in src.options and v is not None]
        operands = [w for w, _ in words.positionals]
        catalog = next(
            (v for name, v in words.options if name in src.database_options and v is not None), None
        )
        if src.database_operand and operands:
            catalog = catalog or operands[0]
            operands = operands[1:]
        if src.operands:
            texts.extend(operands)
        if not texts:
            return _Outcome(
                "deny",
                "unverifiable_sql",
                rule,
                "the SQL would come from stdin or a file, which cannot be checked; "
                "pass it inline (e.g. -c '…')",
                text,
            )
        return _sql_outcome(texts, src, rule, _catalog_of(catalog), text)

    def _words(self, cmd: SimpleCommand) -> _Words:
        name = _program_name(cmd.argv[0])
        program = self._aliases.get(name, name)
        return _split(cmd.argv, self._grammar(program), program)

    def _grammar(self, program: str) -> Program:
        grammar = self._grammars.get(program)
        if grammar is None:
            grammar = _grammar_for(program, self.programs.get(program, Program()), self.roles)
            self._grammars[program] = grammar
        return grammar

    # -- other tools -------------------------------------------------------------------------

    def _other(
        self, lists: Sequence[Sequence[Rule]], stage: str, tool: str, tool_input: Mapping[str, Any]
    ) -> _Outcome:
        worst = _Outcome("allow", "no_rule_matched", None, "no guardrail applies", None)
        allowed_by: _Outcome | None = None
        for rules in lists:
            for rule in rules:
                if rule.when.needs_command or not _tool_stage_input(rule, stage, tool, tool_input):
                    continue
                if rule.sql is not None:
                    texts = [
                        v for k in rule.sql.input_keys if isinstance(v := tool_input.get(k), str)
                    ]
                    outcome = (
                        _sql_outcome(texts, rule.sql, rule, None, tool)
                        if texts
                        else _Outcome(
                            "deny",
                            "unverifiable_sql",
                            rule,
                            f"{tool} call without SQL in "
                            f"{', '.join(rule.sql.input_keys) or 'any field'}",
                            tool,
                        )
                    )
                else:
                    outcome = _rule_outcome(rule, None, tool)
                if _RANK[outcome.verdict] > _RANK[worst.verdict]:
                    worst = outcome
                elif outcome.verdict == "allow" and allowed_by is None:
                    allowed_by = outcome
                break
        return allowed_by if worst.verdict == "allow" and allowed_by is not None else worst


def _aliases(programs: Mapping[str, Program]) -> dict[str, str]:
    return {alias: name for name, p in programs.items() for alias in p.aliases}


def _grammar_for(program: str, base: Program, roles: Mapping[str, Sequence[Rule]]) -> Program:
    """The program's grammar plus every option a rule about it reads a value of."""
    valued = set(base.valued)
    for rules in roles.values():
        for rule in rules:
            progs = {p.words[0] for p in rule.when.commands}
            if progs and program not in progs:
                continue
            valued.update(rule.when.option_values)
            if rule.sql is not None:
                valued.update(rule.sql.options)
                valued.update(rule.sql.database_options)
    return replace(base, valued=frozenset(valued))


def _tool_matches(rule_tools: Sequence[str], tool: str) -> bool:
    if not rule_tools:
        return True
    name = tool.lower()
    for t in rule_tools:
        if t in ("bash", *SHELL_TOOLS) and name in SHELL_TOOLS:
            return True
        if fnmatch.fnmatchcase(name, t):
            return True
    return False


def _tool_stage_input(rule: Rule, stage: str, tool: str, tool_input: Mapping[str, Any]) -> bool:
    when = rule.when
    if stage not in when.stages or not _tool_matches(when.tools, tool):
        return False
    for key, globs in when.input.items():
        value = tool_input.get(key)
        if not isinstance(value, str) or not _glob_any(value, globs):
            return False
    return True


def _command_matches(rule: Rule, words: _Words, env: frozenset[str]) -> bool:
    when = rule.when
    strict = rule.verdict == "allow"
    if when.commands and not any(_pattern_matches(p, words, strict) for p in when.commands):
        return False
    if when.options and not any(name in when.options for name, _ in words.options):
        return False
    if when.option_values and not any(
        value is not None
        and name in when.option_values
        and _glob_any(value, when.option_values[name])
        for name, value in words.options
    ):
        return False
    return not when.env or bool(when.env & env)


def _may_match(rule: Rule, words: _Words, env: frozenset[str]) -> bool:
    """Could words appended at run time make ``rule`` match? (Options may be appended too.)"""
    if rule.when.env and not rule.when.env & env:
        return False
    if not rule.when.commands:
        return bool(rule.when.options or rule.when.option_values)  # env is in the input already
    known = len(words.positionals)
    for pattern in rule.when.commands:
        if pattern.words[0] != words.program:
            continue
        pats = pattern.words[1:]
        if all(
            _word_matches(p, w) for p, (w, _) in zip(pats, words.positionals, strict=False)
        ) and (known <= len(pats) or pattern.rest):
            return True
    return False


def _rule_outcome(rule: Rule, words: _Words | None, text: str) -> _Outcome:
    verdict = rule.verdict or "deny"
    message = rule.message or f"{rule.reason.replace('_', ' ')}: `{text}`"
    if verdict == "require_approval" and words is not None and rule.force_flags:
        typed = [n for n, _ in words.options if n in rule.force_flags]
        typed += [w for w, _ in words.positionals if w in rule.force_flags]
        if typed:
            message += f"; `{typed[0]}` is not consent: a human must approve this exact command"
    return _Outcome(verdict, rule.reason, rule, message, text)


def _catalog_of(database: str | None) -> str | None:
    """The catalog name a database path or name attaches as: ``/d/prod.duckdb`` → ``prod``."""
    if not database or database.startswith(":"):
        return None
    name = database.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return name.split(".", 1)[0] or None


def _sql_outcome(
    texts: Sequence[str], src: SqlSource, rule: Rule | None, catalog: str | None, about: str | None
) -> _Outcome:
    worst: _Outcome | None = None
    for text in texts:
        if src.dialect in ("duckdb", "sqlite") and text.lstrip().startswith("."):
            outcome = _dot_command(text, rule, about)
        else:
            v = check_sql(
                text,
                dialect=src.dialect,
                protected=src.protected,
                catalog=catalog or src.catalog,
                search_path=src.search_path,
                read_only=src.read_only,
            )
            outcome = _Outcome(v.verdict, v.reason, rule, v.message, about)
        if worst is None or _RANK[outcome.verdict] > _RANK[worst.verdict]:
            worst = outcome
    assert worst is not None
    return worst


def _dot_command(text: str, rule: Rule | None, about: str | None) -> _Outcome:
    lines = text.strip().splitlines()
    word = lines[0].split()[0] if lines and lines[0].split() else ""
    if len(lines) == 1 and word in _READ_ONLY_DOT:
        return _Outcome("allow", "sql_allowed", rule, f"`{word}` only reads", about)
    return _Outcome(
        "deny",
        "sql_unsupported",
        rule,
        f"the CLI command `{word or text[:20]}` cannot be checked",
        about,
    )


def _verdict(outcome: _Outcome, subject: str) -> GuardVerdict:
    rule_id = outcome.rule.id if outcome.rule is not None else None
    prefix = "Corral guardrail" + (f" {rule_id}" if rule_id else "")
    message = outcome.message if outcome.verdict == "allow" else f"{prefix}: {outcome.message}"
    approval = subject.strip() if outcome.verdict == "require_approval" else None
    return GuardVerdict(
        outcome.verdict, outcome.reason, rule_id, message, approval, outcome.command
    )


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


class _Bad(ValueError):
    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"guardrails: {where}: {what}")


def load_rules(source: str | Path) -> Guardrails:
    """Parse a rule file: a `Path`, a ``*.yaml``/``*.yml`` path string, or YAML text.

    Raises ValueError naming the place: ``guardrails: roles.notebook[1].when.command: …``.
    """
    if isinstance(source, Path) or (
        "\n" not in source and source.strip().endswith((".yaml", ".yml"))
    ):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise ValueError(f"guardrails: cannot read {path}: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise ValueError(f"guardrails: {path} is not UTF-8 text") from None
    else:
        text = source
    deep = yaml_too_deep(text)
    if deep:
        raise ValueError(f"guardrails: {deep}")
    try:
        data = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"guardrails: malformed YAML{where}: {problem}") from None
    return _load(data if data is not None else {})


@functools.cache
def default_guardrails() -> Guardrails:
    """The shipped guardrails, ``corral/policy/default_guardrails.yaml``."""
    text = resources.files("corral.policy").joinpath("default_guardrails.yaml").read_text("utf-8")
    return load_rules(text)


def _load(data: Any) -> Guardrails:
    top = _mapping(data, "top level", {"version", "programs", "roles"})
    if top.get("version", 1) != 1:
        raise _Bad("version", f"unsupported version {top.get('version')!r} (only 1)")
    programs = {
        name: _program(spec, f"programs.{name}")
        for name, spec in _mapping(top.get("programs") or {}, "programs").items()
    }
    roles: dict[str, tuple[Rule, ...]] = {}
    for role, rules in _mapping(top.get("roles") or {}, "roles").items():
        if not isinstance(rules, list):
            raise _Bad(f"roles.{role}", "must be a list of rules")
        parsed = tuple(_rule(r, f"roles.{role}[{i}]") for i, r in enumerate(rules))
        seen: set[str] = set()
        for rule in parsed:
            if rule.id in seen:
                raise _Bad(rule.where, f"duplicate rule id {rule.id!r} in role {role!r}")
            seen.add(rule.id)
        roles[str(role)] = parsed
    _check_consent(roles)
    return Guardrails(roles=roles, programs=programs)


def _mapping(value: Any, where: str, keys: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(where, f"must be a mapping, not {type(value).__name__}")
    if keys is not None:
        unknown = sorted(str(k) for k in value if k not in keys)
        if unknown:
            raise _Bad(where, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})")
    return {str(k): v for k, v in value.items()}


def _strings(value: Any, where: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise _Bad(where, f"must be a string or a list of strings, not {type(value).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise _Bad(f"{where}[{i}]", f"{item!r} is not a non-empty string (quote it in YAML)")
    if not items and not allow_empty:
        raise _Bad(where, "must not be empty")
    return tuple(items)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(where, "must be true or false")
    return value


def _options(value: Any, where: str) -> tuple[str, ...]:
    names = _strings(value, where)
    for name in names:
        if not name.startswith("-") or name in ("-", "--") or "=" in name or " " in name:
            raise _Bad(where, f"{name!r} is not an option name (e.g. -n or --namespace)")
    return names


def _program(spec: Any, where: str) -> Program:
    m = _mapping(spec, where, {"valued", "flags", "single_dash", "aliases"})
    return Program(
        valued=frozenset(_options(m["valued"], f"{where}.valued"))
        if "valued" in m
        else frozenset(),
        flags=frozenset(_options(m["flags"], f"{where}.flags")) if "flags" in m else frozenset(),
        single_dash=_bool(m.get("single_dash", False), f"{where}.single_dash"),
        aliases=_strings(m.get("aliases", []), f"{where}.aliases", allow_empty=True),
    )


_RULE_KEYS = {"id", "when", "verdict", "reason", "message", "sql", "force_flags"}


def _rule(spec: Any, where: str) -> Rule:
    m = _mapping(spec, where, _RULE_KEYS)
    rule_id = m.get("id")
    if not isinstance(rule_id, str) or not _RULE_ID.match(rule_id):
        raise _Bad(f"{where}.id", "every rule needs an id (letters, digits, - _ . :)")
    if "when" not in m:
        raise _Bad(f"{where}.when", "missing: say which calls the rule is about")
    when = _when(m["when"], f"{where}.when")
    sql = _sql(m["sql"], f"{where}.sql") if "sql" in m else None
    verdict = m.get("verdict")
    if verdict is None and sql is None:
        raise _Bad(f"{where}.verdict", "missing (allow, deny or require_approval)")
    if verdict is not None and verdict not in _VERDICTS:
        raise _Bad(f"{where}.verdict", f"{verdict!r} is not allow, deny or require_approval")
    if verdict is not None and sql is not None:
        raise _Bad(f"{where}.verdict", "an sql rule takes its verdict from the SQL checker")
    reason = m.get("reason", "guardrail_sql" if sql is not None else None)
    if not isinstance(reason, str) or not _REASON.match(reason):
        raise _Bad(
            f"{where}.reason",
            f"needs a snake_case machine code, e.g. cluster_scaling (got {reason!r})",
        )
    message = m.get("message")
    if message is not None and not isinstance(message, str):
        raise _Bad(f"{where}.message", "must be a string")
    force = frozenset(_strings(m.get("force_flags", []), f"{where}.force_flags", allow_empty=True))
    if sql is not None and sql.input_keys and when.needs_command:
        raise _Bad(
            f"{where}.sql.input_keys", "is for non-shell tools; this rule is about shell commands"
        )
    return Rule(
        id=rule_id,
        when=when,
        verdict=cast(GuardVerdictKind | None, verdict),
        reason=reason,
        message=message,
        sql=sql,
        force_flags=force,
        where=where,
    )


_WHEN_KEYS = {"tool", "stage", "command", "option", "option_value", "env", "input"}


def _when(spec: Any, where: str) -> When:
    m = _mapping(spec, where, _WHEN_KEYS)
    stages = _strings(m.get("stage", list(STAGES)), f"{where}.stage")
    for stage in stages:
        if stage not in STAGES:
            raise _Bad(f"{where}.stage", f"{stage!r} is not spawn or tool_call")
    tools = tuple(t.lower() for t in _strings(m["tool"], f"{where}.tool")) if "tool" in m else ()
    commands = _patterns(m["command"], f"{where}.command") if "command" in m else ()
    option_values = {
        name: tuple(g.lower() for g in _strings(globs, f"{where}.option_value.{name}"))
        for name, globs in _mapping(m.get("option_value", {}), f"{where}.option_value").items()
    }
    if option_values:
        _options(list(option_values), f"{where}.option_value")
    when = When(
        tools=tools,
        stages=frozenset(stages),
        commands=commands,
        options=frozenset(_options(m["option"], f"{where}.option"))
        if "option" in m
        else frozenset(),
        option_values=option_values,
        env=frozenset(_strings(m["env"], f"{where}.env")) if "env" in m else frozenset(),
        input={
            k: _strings(v, f"{where}.input.{k}")
            for k, v in _mapping(m.get("input", {}), f"{where}.input").items()
        },
    )
    if when.needs_command and tools and not any(_tool_matches(tools, t) for t in SHELL_TOOLS):
        raise _Bad(where, "command, option, option_value and env only apply to shell tools")
    return when


def _patterns(value: Any, where: str) -> tuple[Pattern, ...]:
    out = []
    for text in _strings(value, where):
        try:
            pattern = parse_pattern(text)
        except ValueError as err:
            raise _Bad(where, str(err)) from None
        if "/" in pattern.words[0]:
            raise _Bad(where, f"{text!r}: name the program without a path (it matches any path)")
        for word in pattern.words[1:]:
            if word.startswith("-") and word != "-":
                raise _Bad(
                    where,
                    f"{text!r}: patterns match positional words; put {word!r} "
                    "under `option` or `option_value`",
                )
        out.append(pattern)
    return tuple(out)


_SQL_KEYS = {
    "dialect",
    "protected",
    "options",
    "operands",
    "database_operand",
    "database_options",
    "input_keys",
    "catalog",
    "search_path",
    "read_only",
}


def _sql(spec: Any, where: str) -> SqlSource:
    m = _mapping(spec, where, _SQL_KEYS)
    dialect = m.get("dialect", "duckdb")
    if dialect not in DIALECTS:
        raise _Bad(
            f"{where}.dialect",
            f"unknown dialect {dialect!r} (known: {', '.join(sorted(DIALECTS))})",
        )
    return SqlSource(
        dialect=dialect,
        protected=tuple(
            p.lower()
            for p in _strings(m.get("protected", []), f"{where}.protected", allow_empty=True)
        ),
        options=_options(m["options"], f"{where}.options") if "options" in m else (),
        operands=_bool(m.get("operands", False), f"{where}.operands"),
        database_operand=_bool(m.get("database_operand", False), f"{where}.database_operand"),
        database_options=_options(m["database_options"], f"{where}.database_options")
        if "database_options" in m
        else (),
        input_keys=_strings(m.get("input_keys", []), f"{where}.input_keys", allow_empty=True),
        catalog=_strings(m["catalog"], f"{where}.catalog")[0].lower() if "catalog" in m else None,
        search_path=tuple(
            s.lower()
            for s in _strings(m.get("search_path", []), f"{where}.search_path", allow_empty=True)
        ),
        read_only=_bool(m.get("read_only", False), f"{where}.read_only"),
    )


def _check_consent(roles: Mapping[str, Sequence[Rule]]) -> None:
    """No allow rule may depend on a flag the agent types: a flag is never consent."""
    force = set(FORCE_WORDS)
    for rules in roles.values():
        for rule in rules:
            force.update(rule.force_flags)
    for rules in roles.values():
        for rule in rules:
            if rule.verdict != "allow":
                continue
            words: list[str] = [*rule.when.options, *rule.when.option_values]
            words += [w for p in rule.when.commands for w in p.words[1:]]
            hit = next((w for w in words if w in force), None)
            if hit is not None:
                raise _Bad(
                    rule.where,
                    f"an allow rule cannot depend on {hit!r}: a flag an "
                    "agent types is never consent",
                )
