"""Which programs would this shell command run? Parsed with tree-sitter-bash, never prefix-matched.

`parse` walks the syntax tree and lists every simple command the shell would run: the parts of
lists and pipelines, the bodies of loops and conditionals, the insides of ``$(…)``, backticks and
``<(…)``, and the commands hidden behind wrappers such as ``sh -c``, ``env``, ``timeout``,
``xargs``, ``find -exec`` (policy/shellwrap.py) or carried by ``ray job submit``, ``kubectl
exec`` and ``ssh`` (policy/shellprograms.py). Anything it cannot account for statically — an
expansion in a command name or argument, an unquoted glob, a syntax error, a construct it does
not know, a character that only looks like shell syntax, a privilege change — becomes a
*problem*, and `check_scope` denies any input with a problem: the checker fails closed.

It also reports what the checker of paths needs (policy/paths.py): every file a redirection
reads or writes, and whether the command changes directory first; and *holds*, things a human
must approve (code installed on a cluster).

The dialect is the shell that will run the command: ``bash``, or ``sh`` (POSIX; dash on Debian,
busybox ash, or bash itself). Under ``sh`` every bash-only construct is a problem, because dash
reads it differently: ``cmd &>/dev/null touch M`` is one command under bash but ``cmd &`` then
``>/dev/null touch M`` under dash. What remains means the same under every POSIX shell.

`check_scope` then matches each command word-wise against the role's patterns (``kubectl *``,
``git status``): every command must match some pattern; a command detached from the attempt
(``&``, ``nohup``, ``setsid``) only a pattern ending in ``&``.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import re
import shlex
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from corral.policy.shellprograms import PROGRAMS
from corral.policy.shellwords import (
    Segs,
    ansi_c,
    dq_literal,
    has_brace_expansion,
    has_glob,
    lookalike,
    snip,
    tilde_prefix,
    unescape,
)
from corral.policy.shellwrap import NAME, WRAPPERS, Ctx, dangerous_env, wrapper_name

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

__all__ = [
    "DIALECTS",
    "MAX_DEPTH",
    "MAX_SOURCE_BYTES",
    "Hold",
    "Parsed",
    "Pattern",
    "Redirect",
    "ScopeVerdict",
    "SimpleCommand",
    "check_scope",
    "parse",
    "parse_pattern",
]

Dialect = Literal["bash", "sh"]
DIALECTS: frozenset[str] = frozenset({"bash", "sh"})
"""The shells the checker models."""

MAX_SOURCE_BYTES = 64 * 1024
"""Longer input is refused outright."""
MAX_DEPTH = 6
"""How deep strings handed to ``sh -c`` / ``eval`` / ``watch`` may nest."""

_PARSER_LOCK = threading.Lock()  # a tree-sitter Parser must not be used by two threads at once


@functools.cache
def _parser() -> Parser:
    """The bash grammar, loaded on the first command to parse rather than at start-up."""
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


@dataclass(frozen=True, slots=True)
class SimpleCommand:
    """One program the shell would run: its words after quote removal, wrappers peeled off."""

    argv: tuple[str, ...]
    wrappers: tuple[str, ...] = ()
    detached: bool = False  # in the background (`&`) or in a session of its own (nohup, setsid)

    def __str__(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True, slots=True)
class Redirect:
    """A file a redirection opens: ``> out.txt`` writes, ``< in.txt`` reads."""

    target: str  # after quote removal; relative to the shell's directory, or `~/…`
    access: Literal["read", "write"]
    operator: str


@dataclass(frozen=True, slots=True)
class Hold:
    """Something a human must approve before the command runs (reason: a snake_case code)."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Parsed:
    """Every simple command in the input, and why (if at all) the input is not fully understood."""

    commands: tuple[SimpleCommand, ...]
    problems: tuple[str, ...]
    redirects: tuple[Redirect, ...] = ()
    holds: tuple[Hold, ...] = ()
    changes_dir: bool = False  # a `cd`, `pushd` or `popd`: later relative paths move


@dataclass(frozen=True, slots=True)
class ScopeVerdict:
    allowed: bool
    reason: str
    command: str | None = None


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed scope pattern: literal or fnmatch words, optionally followed by ``*`` (any rest);
    ``detach``: the pattern ended in ``&``, so it also allows the command detached."""

    source: str
    words: tuple[str, ...]
    rest: bool
    detach: bool = False

    def matches(self, argv: Sequence[str]) -> bool:
        if len(argv) < len(self.words) or (not self.rest and len(argv) != len(self.words)):
            return False
        return all(_word_matches(p, a) for p, a in zip(self.words, argv, strict=False))


def _word_matches(pattern_word: str, word: str) -> bool:
    if _GLOB_CHARS.search(pattern_word):
        return fnmatch.fnmatchcase(word, pattern_word)
    return pattern_word == word


_GLOB_CHARS = re.compile(r"[*?]|\[.*\]")


@functools.lru_cache(maxsize=1024)
def parse_pattern(pattern: str) -> Pattern:
    """Parse one scope pattern such as ``kubectl *`` or ``ray job submit *``.

    Words are split like a shell would (quotes group words). A final ``&`` word lets the command
    run detached (``ray job logs * &``). A final ``*`` word matches any number of remaining
    words; any other word containing ``* ? [`` is an fnmatch pattern for one word. The legacy
    Claude form ``npm run test:*`` is read as ``npm run test *``. A program name is matched
    exactly: ``kubectl`` is the program found on the PATH, ``/opt/bin/kubectl`` that file only.
    Raises ValueError for a pattern that cannot be used.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"a scope pattern must be a string, not {type(pattern).__name__}")
    if any(ord(c) < 32 or c == "\x7f" for c in pattern):
        raise ValueError(f"scope pattern {pattern!r} contains a control character")
    try:
        words = shlex.split(pattern)
    except ValueError as exc:
        raise ValueError(f"scope pattern {pattern!r} cannot be split into words: {exc}") from None
    detach = bool(words) and words[-1] == "&"
    if detach:
        words.pop()
    if not words:
        raise ValueError("a scope pattern must not be empty")
    rest = False
    if words[-1] == "*":
        rest = True
        words.pop()
    elif len(words[-1]) > 2 and words[-1].endswith(":*"):
        rest = True
        words[-1] = words[-1][:-2]
    if not words:
        raise ValueError(
            "scope pattern '*' would allow every command; name the program, e.g. 'kubectl *'"
        )
    if _GLOB_CHARS.search(words[0]):
        raise ValueError(
            f"scope pattern {pattern!r}: the program name {words[0]!r} must be literal"
        )
    return Pattern(source=pattern, words=tuple(words), rest=rest, detach=detach)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


_BLOCKS = frozenset(
    {
        "program",
        "list",
        "pipeline",
        "subshell",
        "compound_statement",
        "do_group",
        "if_statement",
        "elif_clause",
        "else_clause",
        "while_statement",
        "negated_command",
    }
)
_TOKENS = frozenset(
    {
        ";", "&", "&&", "||", "|", "|&", "\n", "(", ")", "{", "}", "!", "if", "then", "elif",
        "else", "fi", "while", "until", "do", "done", "for", "in", "case", "esac",
    }
)  # fmt: skip
_CASE_TOKENS = _TOKENS | {";;", ";&", ";;&"}
_REDIRECTS = frozenset({"file_redirect", "heredoc_redirect", "herestring_redirect"})
_SUBSTITUTIONS = frozenset({"command_substitution", "process_substitution"})
_TEST_EXPRESSIONS = frozenset({"binary_expression", "unary_expression", "parenthesized_expression"})
_ARITH_TEST_OPS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_SAFE_EXPANSION_OPS = frozenset(
    {":-", "-", ":=", "=", ":+", "+", ":?", "?", "#", "##", "%", "%%", "/", "//", "/#", "/%",
     "^", "^^", ",", ",,"}
)  # fmt: skip
_INTEGER = re.compile(r"-?[0-9]+\Z")
_BLANK = frozenset(b" \t\n")
_WRITES = frozenset({">", ">>", ">|", "&>", "&>>"})
_BASH_EXPANSION_OPS = frozenset({"/", "//", "/#", "/%", "^", "^^", ",", ",,"})
_CHDIR = frozenset({"cd", "pushd", "popd"})
_HANDLERS = {**WRAPPERS, **PROGRAMS}


class _Walker:
    def __init__(self, src: bytes, depth: int, wrappers: tuple[str, ...], dialect: Dialect) -> None:
        self.src = src
        self.depth = depth
        self.dialect = dialect
        self.ctx = Ctx(wrappers)
        self.commands: list[SimpleCommand] = []
        self.problems: list[str] = []
        self.spans: list[tuple[int, int]] = []
        self.redirects: list[Redirect] = []
        self.holds: list[Hold] = []
        self.changes_dir = False

    # -- bookkeeping --------------------------------------------------------------------------

    def text(self, node: Node) -> str:
        return self.src[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def cover(self, node: Node) -> None:
        if node.end_byte > node.start_byte:
            self.spans.append((node.start_byte, node.end_byte))

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def hold(self, reason: str, message: str) -> None:
        self.holds.append(Hold(reason, message))

    def bashism(self, what: str) -> None:
        """Under sh, bash-only syntax means something else (or nothing): refuse it there."""
        if self.dialect == "sh":
            self.problem(
                f"`{what}` is bash syntax, but this command runs under sh, which reads "
                "it differently"
            )

    def unsupported(self, node: Node) -> None:
        self.cover(node)
        if node.type == "ERROR" or node.is_missing:
            self.problem(f"syntax error near `{snip(self.text(node))}`")
        else:
            self.problem(f"unsupported shell syntax ({node.type}): `{snip(self.text(node))}`")

    def check_coverage(self) -> None:
        pos = 0
        for start, end in sorted(self.spans):
            if start > pos:
                self.check_gap(pos, start)
            pos = max(pos, end)
        if pos < len(self.src):
            self.check_gap(pos, len(self.src))

    def check_gap(self, start: int, end: int) -> None:
        src, i = self.src, start
        while i < end:
            c = src[i]
            if c in _BLANK:
                i += 1
            elif (
                c == 0x5C and i + 1 < end and src[i + 1] == 0x0A and i > 0 and src[i - 1] in _BLANK
            ):
                i += 2  # a line continuation after a blank joins nothing
            else:
                near = src[i : i + 30].decode("utf-8", "replace")
                self.problem(f"part of the input was not understood, near `{snip(near)}`")
                return

    # -- statements ---------------------------------------------------------------------------

    def statement(self, node: Node) -> None:
        kind = node.type
        if kind in _BLOCKS:
            self.block(node)
        elif kind == "comment":
            self.cover(node)
        else:
            handler = _STATEMENTS.get(kind)
            if handler is None:
                self.unsupported(node)
            else:
                handler(self, node)

    def block(self, node: Node) -> None:
        kids = node.children
        if node.type == "compound_statement" and kids and kids[0].type == "((":
            self.problem(f"arithmetic evaluation is not supported: `{snip(self.text(node))}`")
            self.collect(node)
            return
        self.statements(kids)

    def statements(self, kids: Sequence[Node]) -> None:
        """A sequence of statements and the tokens between them (`;`, `&&`, `&` …)."""
        for i, child in enumerate(kids):
            if child.is_named and i + 1 < len(kids) and kids[i + 1].type == "&":
                self.detached(child)
            elif child.is_named:
                self.statement(child)
            elif child.type in _TOKENS:
                if child.type == "|&":
                    self.bashism("|&")
                self.cover(child)
            else:
                self.unsupported(child)

    def detached(self, node: Node) -> None:
        """A statement followed by `&`: it runs in the background, past the tool call."""
        saved = self.ctx
        self.ctx = saved.detach()
        try:
            self.statement(node)
        finally:
            self.ctx = saved

    def collect(self, node: Node) -> None:
        """Walk a construct already judged a problem, only to collect inner substitutions."""
        if node.type in _SUBSTITUTIONS:
            self.substitution(node)
        elif node.child_count == 0:
            self.cover(node)
        else:
            for child in node.children:
                self.collect(child)

    def stmt_command(self, node: Node) -> None:
        self.command(node, [])

    def command(self, node: Node, extra: list[Node]) -> None:
        words = list(extra)
        trailing: list[Node] = []
        for i, child in enumerate(node.children):
            kind = child.type
            if kind == "variable_assignment":
                self.assignment(child, argv=False)
            elif kind in _REDIRECTS:
                self.redirect(child, words, trailing)
            elif kind == "command_name" and child.named_child_count == 1:
                words.append(child.named_children[0])
            elif node.field_name_for_child(i) == "argument":
                words.append(child)
            else:
                self.unsupported(child)
        words.sort(key=lambda n: n.start_byte)
        argv = self.resolve_argv(words)
        if argv:
            self.emit(argv, self.ctx)
        for stmt in trailing:
            self.statement(stmt)

    def stmt_redirected(self, node: Node) -> None:
        body: Node | None = None
        words: list[Node] = []
        trailing: list[Node] = []
        for i, child in enumerate(node.children):
            if node.field_name_for_child(i) == "body":
                body = child
            elif child.type in _REDIRECTS:
                self.redirect(child, words, trailing)
            else:
                self.unsupported(child)
        if body is not None and body.type == "command":
            self.command(body, words)
        else:
            if words:
                self.problem(f"unexpected words after a redirection: `{snip(self.text(node))}`")
            if body is not None:
                self.statement(body)
        for stmt in trailing:
            self.statement(stmt)

    def stmt_assignments(self, node: Node) -> None:
        if node.type == "variable_assignment":
            self.assignment(node, argv=False)
            return
        for child in node.children:
            if child.type == "variable_assignment":
                self.assignment(child, argv=False)
            else:
                self.unsupported(child)

    def stmt_declaration(self, node: Node) -> None:
        """``export``/``declare``/``local``/``readonly``/``typeset``/``unset``: plain commands."""
        argv: list[str] = []
        ok = True
        for child in node.children:
            kind = child.type
            if kind == "variable_assignment":
                word = self.assignment(child, argv=True)
                ok = ok and word is not None
                argv.append(word or "")
            elif not child.is_named or kind == "variable_name":
                self.cover(child)
                argv.append(self.text(child))
            else:
                segs = self.resolve_word([child], argv=True)
                ok = ok and segs is not None
                argv.append("".join(t for t, _ in segs or ()))
        if ok:
            self.add(argv, self.ctx)

    def stmt_test(self, node: Node) -> None:
        """``[ … ]`` and ``[[ … ]]`` become commands named ``[`` / ``[[`` that must be allowed."""
        argv: list[str] = []
        if node.children and node.children[0].type == "[[":
            self.bashism("[[ … ]]")
        if self.test_words(node, argv):
            self.add(argv, self.ctx)

    def test_words(self, node: Node, out: list[str]) -> bool:
        ok = True
        for child in node.children:
            if child.type in _TEST_EXPRESSIONS:
                ok = self.test_words(child, out) and ok
            elif not child.is_named or child.type == "test_operator":
                self.cover(child)
                out.append(self.text(child))
            else:
                segs = self.resolve_word([child], argv=True)
                if segs is None:
                    ok = False
                else:
                    out.append("".join(t for t, _ in segs))
        return ok

    def stmt_for(self, node: Node) -> None:
        for i, child in enumerate(node.children):
            field = node.field_name_for_child(i)
            if child.type == "select":
                self.problem("`select` reads from the terminal and is not supported")
                self.cover(child)
            elif field == "variable":
                self.cover(child)
            elif field == "value":
                self.word(child, argv=False)
            elif field == "body" or child.type == "comment":
                self.statement(child)
            elif not child.is_named and child.type in _TOKENS:
                self.cover(child)
            else:
                self.unsupported(child)

    def stmt_case(self, node: Node) -> None:
        for i, child in enumerate(node.children):
            field = node.field_name_for_child(i)
            if field == "value":
                self.word(child, argv=False)
            elif child.type == "case_item":
                self.case_item(child)
            elif child.type == "comment" or (not child.is_named and child.type in _TOKENS):
                self.cover(child)
            else:
                self.unsupported(child)

    def case_item(self, node: Node) -> None:
        for i, child in enumerate(node.children):
            field = node.field_name_for_child(i)
            if field == "value":
                self.word(child, argv=False)
            elif child.is_named and field != "termination":
                self.statement(child)
            elif child.type in _CASE_TOKENS:
                if child.type in (";&", ";;&"):
                    self.bashism(child.type)
                self.cover(child)
            else:
                self.unsupported(child)

    def stmt_c_for(self, node: Node) -> None:
        self.problem("arithmetic `for ((…))` loops are not supported")
        for i, child in enumerate(node.children):
            if node.field_name_for_child(i) == "body":
                self.statement(child)
            else:
                self.collect(child)

    def stmt_function(self, node: Node) -> None:
        self.problem(f"defining shell functions is not allowed: `{snip(self.text(node))}`")
        self.collect(node)

    # -- assignments and redirections -----------------------------------------------------------

    def assignment(self, node: Node, argv: bool) -> str | None:
        """Check one ``NAME=value``; return it as a word (``None`` if it cannot be resolved)."""
        name, op, value = "", "", ""
        resolved = True
        for i, child in enumerate(node.children):
            field = node.field_name_for_child(i)
            if field == "name":
                name = self.assignment_name(child)
            elif field == "value":
                if child.type == "array":
                    resolved = self.array(child, argv) and resolved
                else:
                    segs = self.word(child, argv)
                    resolved = resolved and segs is not None
                    value = "".join(t for t, _ in segs or ())
            elif not child.is_named:
                self.cover(child)
                op = self.text(child)
            else:
                self.unsupported(child)
                resolved = False
        base = name.split("[", 1)[0]
        if dangerous_env(base):
            self.problem(f"setting `{base}` can change which program runs, so it is not allowed")
        return name + op + value if resolved else None

    def assignment_name(self, node: Node) -> str:
        if node.type == "variable_name":
            self.cover(node)
            return self.text(node)
        if node.type == "subscript":
            index = node.child_by_field_name("index")
            if index is not None and _INTEGER.match(self.text(index)):
                self.cover(node)
                return self.text(node)
            self.problem(f"array subscripts are evaluated as arithmetic: `{self.text(node)}`")
            self.collect(node)
            return self.text(node)
        self.unsupported(node)
        return ""

    def array(self, node: Node, argv: bool) -> bool:
        self.bashism("name=(…)")
        for child in node.children:
            if child.is_named:
                self.word(child, argv=False)
            else:
                self.cover(child)
        if argv:
            self.problem(f"array values cannot be checked: `{snip(self.text(node))}`")
        return not argv

    def redirect(self, node: Node, words: list[Node], trailing: list[Node]) -> None:
        if node.type == "heredoc_redirect":
            self.heredoc(node, words, trailing)
            return
        here = node.type == "herestring_redirect"
        if here:
            self.bashism("<<<")
        op, first = "", True
        for i, child in enumerate(node.children):
            field = node.field_name_for_child(i)
            if field == "destination" and not first:
                words.append(child)  # tree-sitter hangs later words of the command here
            elif field == "destination" or (here and child.is_named):
                first = False
                if here:
                    self.word(child, argv=False)  # data on stdin, not a file
                else:
                    self.target(op, child)
            elif child.type == "file_descriptor" or not child.is_named:
                self.cover(child)
                op = op if child.is_named else child.type
            else:
                self.unsupported(child)

    def target(self, op: str, node: Node) -> None:
        """The file a redirection opens, resolved like an argument (or a problem)."""
        if op in ("&>", "&>>"):
            self.bashism(op)
        if op in (">&", "<&") and (node.type == "number" or self.text(node) == "-"):
            self.cover(node)  # `2>&1`, `>&-`: a descriptor, not a file
            return
        segs = self.resolve_word([node], argv=True)
        if segs is None:
            return
        target = "".join(t for t, _ in segs)
        chars = [(ch, q) for text, q in segs for ch in text]
        if has_glob(chars) or has_brace_expansion(chars):
            self.problem(
                f"the redirection target `{snip(target)}` is a pattern the shell expands; quote it"
            )
        elif chars and chars[0] == ("~", False) and tilde_prefix(chars):
            self.problem(
                f"tilde expansion in the redirection target `{snip(target)}` cannot be "
                "resolved statically"
            )
        elif target.startswith(("/dev/tcp/", "/dev/udp/")):
            self.problem(f"redirection to a network socket `{target}` is not allowed")
        elif op == "<&" or not target:
            self.problem(f"cannot tell which file `{op}{snip(target)}` opens")
        else:
            if op == ">&":
                self.bashism(">&file")
            if chars and chars[0] == ("~", True):
                target = "./" + target  # a quoted tilde is a directory named `~`
            access: Literal["read", "write"] = "write" if op in _WRITES or op == ">&" else "read"
            self.redirects.append(Redirect(target, access, op))

    def heredoc(self, node: Node, words: list[Node], trailing: list[Node]) -> None:
        quoted = False
        for i, child in enumerate(node.children):
            kind, field = child.type, node.field_name_for_child(i)
            if kind == "heredoc_start":
                self.cover(child)
                quoted = any(c in self.text(child) for c in "'\"\\")
            elif kind == "heredoc_body":
                self.heredoc_body(child, quoted)
            elif kind == "heredoc_end":
                self.cover(child)
            elif kind in _REDIRECTS:
                self.redirect(child, words, trailing)
            elif field == "argument":
                words.append(child)
            elif field == "right" or kind == "pipeline":
                trailing.append(child)  # tree-sitter hangs the rest of the line here
            elif not child.is_named and kind in {"<<", "<<-", "&&", "||", "|", "|&"}:
                self.cover(child)
            else:
                self.unsupported(child)

    def heredoc_body(self, node: Node, quoted: bool) -> None:
        """Scan the raw body: tree-sitter misses some substitutions in here-documents."""
        self.cover(node)
        if quoted:
            return
        nodes = {c.start_byte: c for c in node.named_children}
        src, i, end = self.src, node.start_byte, node.end_byte
        while i < end:
            c = src[i : i + 1]
            if c == b"\\":
                i += 2
                continue
            if c == b"`":
                self.problem("backticks in a here-document run commands and are not supported")
                return
            if c == b"$" and src[i + 1 : i + 2] in (b"(", b"{", b"["):
                child = nodes.get(i)
                if src[i + 1 : i + 3] in (b"((", b"[") or child is None:
                    near = src[i : i + 30].decode("utf-8", "replace")
                    self.problem(f"here-document expansion not supported: `{snip(near)}`")
                    return
                self.word(child, argv=False)
                i = child.end_byte
                continue
            i += 1

    # -- words ------------------------------------------------------------------------------------

    def resolve_argv(self, nodes: list[Node]) -> list[str] | None:
        """Turn argument nodes into words; ``None`` (with a problem) if any is not static."""
        argv: list[str] = []
        ok = True
        for group in self.adjacent_groups(nodes):
            segs = self.resolve_word(group, argv=True)
            if segs is None:
                ok = False
                continue
            where = "command name" if not argv else "argument"
            ok = self.check_word(segs, is_name=not argv, where=where) and ok
            argv.append("".join(t for t, _ in segs))
        return argv if ok else None

    @staticmethod
    def adjacent_groups(nodes: list[Node]) -> list[list[Node]]:
        """tree-sitter sometimes splits one shell word into touching nodes; rejoin them."""
        groups: list[list[Node]] = []
        for node in nodes:
            if groups and groups[-1][-1].end_byte == node.start_byte:
                groups[-1].append(node)
            else:
                groups.append([node])
        return groups

    def check_word(self, segs: Segs, is_name: bool, where: str) -> bool:
        if not any(c in text for text, q in segs if not q for c in "{~*?["):
            return True  # the common case: nothing unquoted that the shell would expand
        word = "".join(t for t, _ in segs)
        chars = [(ch, q) for text, q in segs for ch in text]
        reason = None
        if is_name and any(ch in "*?[" and not q for ch, q in chars):
            reason = "a glob"
        elif has_glob(chars):
            self.problem(
                f"the shell expands the unquoted pattern `{snip(word)}` into file names, "
                "so what runs cannot be known; quote it"
            )
            return False
        elif has_brace_expansion(chars):
            reason = "brace expansion"
        elif chars and chars[0] == ("~", False) and (is_name or tilde_prefix(chars)):
            reason = "tilde expansion"
        if reason is not None:
            self.problem(f"{reason} in {where} `{snip(word)}` cannot be resolved statically")
            return False
        return True

    def resolve_word(self, nodes: list[Node], argv: bool) -> Segs | None:
        out: Segs = []
        ok = True
        for i, node in enumerate(nodes):
            if (
                node.type == "$"
                and i + 1 < len(nodes)
                and nodes[i + 1].type in ("string", "raw_string")
            ):
                self.cover(node)
                self.problem('`$"…"` locale translation is not supported')
                ok = False
                continue
            segs = self.word(node, argv)
            if segs is None:
                ok = False
            else:
                out.extend(segs)
        return out if ok else None

    def word(self, node: Node, argv: bool) -> Segs | None:
        """Resolve one word node; collects substitutions. ``None`` if it is not static."""
        if node.is_missing:
            self.problem("the command is incomplete")
            return None
        if not node.is_named:
            self.cover(node)
            return [(self.text(node), False)]  # `==`, `=~`, a lone `$`: literal
        handler = _WORDS.get(node.type)
        if handler is None:
            self.unsupported(node)
            return None
        return handler(self, node, argv)

    def w_word(self, node: Node, argv: bool) -> Segs | None:
        self.cover(node)
        segs = unescape(self.text(node))
        if segs is None:
            self.problem(f"cannot read the word `{snip(self.text(node))}`")
        return segs

    def w_literal(self, node: Node, argv: bool) -> Segs | None:
        self.cover(node)
        text = self.text(node)
        if "`" in text or re.search(r"\$[({\[]", text):
            self.problem(f"unparsed expansion in `{snip(text)}`")
            return None
        return [(text, node.type == "regex")]

    def w_raw_string(self, node: Node, argv: bool) -> Segs | None:
        self.cover(node)
        text = self.text(node)
        if len(text) < 2 or text[0] != "'" or text[-1] != "'":
            self.unsupported(node)
            return None
        return [(text[1:-1], True)]

    def w_ansi_c(self, node: Node, argv: bool) -> Segs | None:
        self.cover(node)
        self.bashism("$'…'")
        text = self.text(node)
        decoded = ansi_c(text[2:-1]) if text.startswith("$'") and text.endswith("'") else None
        if decoded is None:
            self.problem(f"cannot decode `{snip(text)}`")
            return None
        return [(decoded, True)]

    def w_string(self, node: Node, argv: bool) -> Segs | None:
        """A double-quoted string, read from its raw bytes so nothing tree-sitter drops is lost."""
        kids = node.children
        if len(kids) < 2 or kids[0].type != '"' or kids[-1].type != '"':
            self.unsupported(node)
            return None
        self.cover(node)
        out: Segs = []
        ok = True
        raw: list[str] = []
        pos = kids[0].end_byte
        for child in kids[1:-1]:
            if child.type == "string_content" or child.type == "$":
                continue
            raw.append(self.src[pos : child.start_byte].decode("utf-8", "replace"))
            ok = self.flush_dq(raw, out) and ok
            segs = self.word(child, argv) if child.is_named else None
            if segs is None:
                ok = False
            else:
                out.extend((t, True) for t, _ in segs)
            pos = child.end_byte
        raw.append(self.src[pos : kids[-1].start_byte].decode("utf-8", "replace"))
        ok = self.flush_dq(raw, out) and ok
        return out if ok else None

    def flush_dq(self, raw: list[str], out: Segs) -> bool:
        text = "".join(raw)
        raw.clear()
        literal = dq_literal(text)
        if literal is None:
            self.problem(f"unparsed expansion inside quotes: `{snip(text)}`")
            return False
        if literal:
            out.append((literal, True))
        return True

    def w_concatenation(self, node: Node, argv: bool) -> Segs | None:
        kids = node.children
        for a, b in itertools.pairwise(kids):
            if a.end_byte != b.start_byte:
                self.problem(f"cannot read the word `{snip(self.text(node))}`")
                self.collect(node)
                return None
        return self.resolve_word(kids, argv)

    def w_expansion(self, node: Node, argv: bool) -> Segs | None:
        if any(c.type in _BASH_EXPANSION_OPS for c in node.children):
            self.bashism(snip(self.text(node)))
        for child in node.children:
            if child.type == "string":
                self.w_string(child, argv=False)
            else:
                self.collect(child)
        text = snip(self.text(node))
        if argv:
            self.problem(f"`{text}` is an expansion whose value is only known at run time")
        elif node.type == "expansion" and not _safe_expansion(node):
            self.problem(f"`{text}` may evaluate arithmetic or indirection, which is not supported")
        return None

    def w_substitution(self, node: Node, argv: bool) -> Segs | None:
        self.substitution(node)
        if argv:
            text = snip(self.text(node))
            self.problem(f"`{text}` is only known at run time (it runs a command)")
        return None

    def w_arithmetic(self, node: Node, argv: bool) -> Segs | None:
        self.problem(f"arithmetic expansion is not supported: `{snip(self.text(node))}`")
        self.collect(node)
        return None

    def w_brace(self, node: Node, argv: bool) -> Segs | None:
        self.cover(node)
        if argv:
            self.problem(f"brace expansion `{snip(self.text(node))}` is not supported")
        return None

    def substitution(self, node: Node) -> None:
        if node.type == "process_substitution":
            self.bashism("<(…)")
        kids = node.children
        if len(kids) < 2 or kids[0].is_named or kids[-1].is_named:
            self.unsupported(node)
            return
        if kids[0].type == "`" and "\\" in self.text(node):
            self.problem("backslashes inside backticks change how the command is read; use $(…)")
        self.cover(kids[0])
        self.cover(kids[-1])
        self.statements(kids[1:-1])

    # -- commands and wrappers ------------------------------------------------------------------

    def emit(self, argv: list[str], ctx: Ctx) -> None:
        """Record a command, first peeling any wrapper that runs another command."""
        name = argv[0]
        if ctx.placeholder and ctx.placeholder in name:
            self.problem(f"the program `{name}` is only filled in at run time")
            return
        base = wrapper_name(name)
        handler = _HANDLERS.get(base) if base is not None else None
        if handler is None:
            self.add(argv, ctx)
        else:
            handler(self, argv, ctx)

    def add(self, argv: list[str], ctx: Ctx) -> None:
        if argv[0] in ("[", "[[", "test"):
            for i, word in enumerate(argv[:-1]):
                if word in ("-v", "-R") and not NAME.match(argv[i + 1]):
                    self.problem(f"`{word} {argv[i + 1]}` evaluates a subscript as arithmetic")
                    return
                arith = argv[0] == "[[" and word in _ARITH_TEST_OPS
                if arith and not (_INTEGER.match(argv[i - 1]) and _INTEGER.match(argv[i + 1])):
                    self.problem("`[[ … -eq … ]]` on non-numbers evaluates arithmetic")
                    return
        if argv[0] in _CHDIR:
            self.changes_dir = True
        self.commands.append(SimpleCommand(tuple(argv), ctx.wrappers, ctx.detached))

    def nested(self, code: str, ctx: Ctx, label: str, dialect: str | None = None) -> None:
        """Parse a string a shell will parse again (``sh -c``, ``eval``, a Ray entrypoint)."""
        if ctx.placeholder and ctx.placeholder in code:
            self.problem(f"`{label}` code contains `{ctx.placeholder}`, filled in at run time")
            return
        if self.depth >= MAX_DEPTH:
            self.problem(f"commands nested more than {MAX_DEPTH} levels deep")
            return
        inner = _analyse(
            code,
            self.depth + 1,
            ctx.wrap(label),
            "sh" if (dialect or self.dialect) == "sh" else "bash",
        )
        self.commands.extend(inner.commands)
        self.problems.extend(f"in `{label}` string: {p}" for p in inner.problems)
        self.redirects.extend(inner.redirects)
        self.holds.extend(inner.holds)
        self.changes_dir = self.changes_dir or inner.changes_dir

    def wrapped(self, argv: list[str], start: int, ctx: Ctx, label: str) -> None:
        """Continue with the command that starts at ``argv[start]``."""
        if start >= len(argv):
            self.problem(f"cannot tell which command `{snip(shlex.join(argv))}` runs")
            return
        self.emit(argv[start:], ctx.wrap(label))


_STATEMENTS: dict[str, Callable[[_Walker, Node], None]] = {
    "command": _Walker.stmt_command,
    "redirected_statement": _Walker.stmt_redirected,
    "variable_assignment": _Walker.stmt_assignments,
    "variable_assignments": _Walker.stmt_assignments,
    "declaration_command": _Walker.stmt_declaration,
    "unset_command": _Walker.stmt_declaration,
    "test_command": _Walker.stmt_test,
    "for_statement": _Walker.stmt_for,
    "case_statement": _Walker.stmt_case,
    "c_style_for_statement": _Walker.stmt_c_for,
    "function_definition": _Walker.stmt_function,
}

_WORDS: dict[str, Callable[[_Walker, Node, bool], Segs | None]] = {
    "word": _Walker.w_word,
    "number": _Walker.w_literal,
    "extglob_pattern": _Walker.w_literal,
    "regex": _Walker.w_literal,
    "raw_string": _Walker.w_raw_string,
    "ansi_c_string": _Walker.w_ansi_c,
    "string": _Walker.w_string,
    "concatenation": _Walker.w_concatenation,
    "simple_expansion": _Walker.w_expansion,
    "expansion": _Walker.w_expansion,
    "command_substitution": _Walker.w_substitution,
    "process_substitution": _Walker.w_substitution,
    "arithmetic_expansion": _Walker.w_arithmetic,
    "brace_expression": _Walker.w_brace,
}


def _safe_expansion(node: Node) -> bool:
    """``${name}``, ``${#name}``, default/pattern operators: no arithmetic, no indirection."""
    inner = node.children[1:-1]
    if inner and inner[0].type == "#":
        inner = inner[1:]
        if len(inner) != 1:
            return False
    if not inner or inner[0].type not in ("variable_name", "special_variable_name"):
        return False
    return len(inner) == 1 or inner[1].type in _SAFE_EXPANSION_OPS


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _analyse(source: str, depth: int, ctx: Ctx, dialect: Dialect) -> Parsed:
    try:
        src = source.encode("utf-8")
    except UnicodeEncodeError:
        return Parsed((), ("the command is not valid text",))
    if len(src) > MAX_SOURCE_BYTES:
        return Parsed((), (f"the command is longer than {MAX_SOURCE_BYTES} bytes",))
    if b"\0" in src:
        return Parsed((), ("the command contains a NUL byte",))
    if (odd := lookalike(source)) is not None:
        return Parsed(
            (),
            (
                f"the command contains {odd}, which looks like shell syntax (or hides "
                "text) but is not; write it in plain ASCII",
            ),
        )
    with _PARSER_LOCK:
        tree = _parser().parse(src)
    walker = _Walker(src, depth, ctx.wrappers, dialect)
    walker.ctx = ctx
    root = tree.root_node
    if root.has_error:
        walker.problem("the command is incomplete or has a syntax error")
    walker.statement(root)
    walker.check_coverage()
    problems = tuple(dict.fromkeys(walker.problems))
    return Parsed(
        tuple(walker.commands),
        problems,
        tuple(walker.redirects),
        tuple(dict.fromkeys(walker.holds)),
        walker.changes_dir,
    )


@functools.lru_cache(maxsize=2048)
def parse(source: str, dialect: str = "bash") -> Parsed:
    """Every simple command ``source`` would run under ``dialect`` (``bash`` or ``sh``), and
    anything that could not be accounted for. Raises ValueError for another dialect."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown shell dialect {dialect!r} (Corral models bash and sh)")
    return _analyse(source, 0, Ctx(()), "sh" if dialect == "sh" else "bash")


def check_scope(source: str, patterns: Sequence[str], dialect: str = "bash") -> ScopeVerdict:
    """Allow ``source`` only if it is fully understood and every command matches a pattern.

    A command detached from the attempt (``&``, ``nohup``, ``setsid``) must match a pattern
    ending in ``&``; one whose trailing words are appended at run time (``xargs``, ``find -exec
    … +``) a pattern ending in ``*``. Raises ValueError for a bad pattern or dialect.
    """
    compiled = [parse_pattern(p) for p in patterns]
    allowed = ", ".join(patterns) if patterns else "none"
    parsed = parse(source, dialect)
    offender = next((c for c in parsed.commands if not _command_allowed(c, compiled, False)), None)
    detached = next((c for c in parsed.commands if not _command_allowed(c, compiled)), None)
    if offender is not None or detached is not None:
        cmd = offender or detached
        assert cmd is not None
        text = shlex.join(cmd.argv)
        if offender is None:
            reason = (
                f"`{text}` would run detached from the attempt (`&`, nohup, setsid), "
                "which this role's scope does not allow (a pattern ending in `&` does)"
            )
        else:
            reason = f"`{text}` is outside this role's scope (allowed: {allowed})"
        if parsed.problems:
            reason += f"; also: {parsed.problems[0]}"
        return ScopeVerdict(False, reason, text)
    if parsed.problems:
        more = f" (and {len(parsed.problems) - 1} more)" if len(parsed.problems) > 1 else ""
        return ScopeVerdict(False, f"cannot verify this command: {parsed.problems[0]}{more}", None)
    if not compiled:
        return ScopeVerdict(False, "this role may not run shell commands (allowed: none)", None)
    return ScopeVerdict(True, "every command is within this role's scope", None)


def _command_allowed(
    cmd: SimpleCommand, patterns: Sequence[Pattern], detached: bool | None = None
) -> bool:
    appended = any(w == "xargs" or w.endswith(" +") for w in cmd.wrappers)
    detach = cmd.detached if detached is None else detached
    return any(
        p.matches(cmd.argv) and (p.rest or not appended) and (p.detach or not detach)
        for p in patterns
    )
