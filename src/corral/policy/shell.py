"""Which programs would this shell command run? Parsed with tree-sitter-bash, never prefix-matched.

`parse` walks the syntax tree and lists every simple command the shell would run: the parts of
lists and pipelines, the bodies of loops and conditionals, the insides of ``$(…)``, backticks and
``<(…)``, and the commands hidden behind wrappers such as ``sh -c``, ``env``, ``timeout``,
``xargs`` and ``find -exec``. Anything it cannot account for statically — an expansion in a
command name or argument, a syntax error, a construct it does not know — becomes a *problem*, and
`check_scope` denies any input with a problem: the checker fails closed.

`check_scope` then matches each command word-wise against the role's patterns (``kubectl *``,
``git status``): every command must match some pattern.
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

__all__ = [
    "MAX_DEPTH",
    "MAX_SOURCE_BYTES",
    "Parsed",
    "Pattern",
    "ScopeVerdict",
    "SimpleCommand",
    "check_scope",
    "parse",
    "parse_pattern",
]

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

    def __str__(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True, slots=True)
class Parsed:
    """Every simple command in the input, and why (if at all) the input is not fully understood."""

    commands: tuple[SimpleCommand, ...]
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ScopeVerdict:
    allowed: bool
    reason: str
    command: str | None = None


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed scope pattern: literal or fnmatch words, optionally followed by ``*`` (any rest)."""

    source: str
    words: tuple[str, ...]
    rest: bool

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

    Words are split like a shell would (quotes group words). A final ``*`` word matches any
    number of remaining words; any other word containing ``* ? [`` is an fnmatch pattern for one
    word. The legacy Claude form ``npm run test:*`` is read as ``npm run test *``.
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
    return Pattern(source=pattern, words=tuple(words), rest=rest)


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------

_Segs = list[tuple[str, bool]]  # (text, quoted) pieces of one word

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
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INTEGER = re.compile(r"-?[0-9]+\Z")
_SYSTEM_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"})
_BLANK = frozenset(b" \t\n")

# Environment variables that change which code a command runs (or how the shell runs it).
_DANGEROUS_ENV = frozenset(
    {
        "PATH", "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
        "CDPATH", "GLOBIGNORE", "PAGER", "EDITOR", "VISUAL", "MANPAGER", "LESSOPEN",
        "LESSCLOSE", "BROWSER", "KUBE_EDITOR", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB",
        "RUBYOPT", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "SSH_ASKPASS",
        "SUDO_ASKPASS", "GCONV_PATH", "HOSTALIASES",
    }
)  # fmt: skip
_DANGEROUS_ENV_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "GIT_", "PYTHON", "NODE_")


def _dangerous_env(name: str) -> bool:
    return name in _DANGEROUS_ENV or name.startswith(_DANGEROUS_ENV_PREFIXES)


def _snip(text: str, limit: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class _Ctx:
    """How a command was reached: the wrappers peeled so far, and what they may inject."""

    wrappers: tuple[str, ...]
    placeholder: str | None = None  # text replaced at run time (xargs -I, find's {})
    appended: bool = False  # unknown words are appended at run time (xargs, find -exec … +)

    def wrap(self, label: str, placeholder: str | None = None, appended: bool = False) -> _Ctx:
        return _Ctx(
            (*self.wrappers, label),
            placeholder or self.placeholder,
            appended or self.appended,
        )


class _Walker:
    def __init__(self, src: bytes, depth: int, wrappers: tuple[str, ...]) -> None:
        self.src = src
        self.depth = depth
        self.ctx = _Ctx(wrappers)
        self.commands: list[SimpleCommand] = []
        self.problems: list[str] = []
        self.spans: list[tuple[int, int]] = []

    # -- bookkeeping --------------------------------------------------------------------------

    def text(self, node: Node) -> str:
        return self.src[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def cover(self, node: Node) -> None:
        if node.end_byte > node.start_byte:
            self.spans.append((node.start_byte, node.end_byte))

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def unsupported(self, node: Node) -> None:
        self.cover(node)
        if node.type == "ERROR" or node.is_missing:
            self.problem(f"syntax error near `{_snip(self.text(node))}`")
        else:
            self.problem(f"unsupported shell syntax ({node.type}): `{_snip(self.text(node))}`")

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
                self.problem(f"part of the input was not understood, near `{_snip(near)}`")
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
            self.problem(f"arithmetic evaluation is not supported: `{_snip(self.text(node))}`")
            self.collect(node)
            return
        for child in kids:
            if child.is_named:
                self.statement(child)
            elif child.type in _TOKENS:
                self.cover(child)
            else:
                self.unsupported(child)

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
                self.problem(f"unexpected words after a redirection: `{_snip(self.text(node))}`")
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
        self.problem(f"defining shell functions is not allowed: `{_snip(self.text(node))}`")
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
        if _dangerous_env(base):
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
        for child in node.children:
            if child.is_named:
                self.word(child, argv=False)
            else:
                self.cover(child)
        if argv:
            self.problem(f"array values cannot be checked: `{_snip(self.text(node))}`")
        return not argv

    def redirect(self, node: Node, words: list[Node], trailing: list[Node]) -> None:
        if node.type == "heredoc_redirect":
            self.heredoc(node, words, trailing)
            return
        first = True
        for i, child in enumerate(node.children):
            field = node.field_name_for_child(i)
            if field == "destination" and not first:
                words.append(child)  # tree-sitter hangs later words of the command here
            elif field == "destination" or (node.type == "herestring_redirect" and child.is_named):
                first = False
                segs = self.word(child, argv=False)
                target = "".join(t for t, _ in segs or ())
                if target.startswith(("/dev/tcp/", "/dev/udp/")):
                    self.problem(f"redirection to a network socket `{target}` is not allowed")
            elif child.type == "file_descriptor" or not child.is_named:
                self.cover(child)
            else:
                self.unsupported(child)

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
                    self.problem(f"here-document expansion not supported: `{_snip(near)}`")
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

    def check_word(self, segs: _Segs, is_name: bool, where: str) -> bool:
        if not any(c in text for text, q in segs if not q for c in "{~*?["):
            return True  # the common case: nothing unquoted that the shell would expand
        word = "".join(t for t, _ in segs)
        chars = [(ch, q) for text, q in segs for ch in text]
        reason = None
        if is_name and any(ch in "*?[" and not q for ch, q in chars):
            reason = "a glob"
        elif _has_brace_expansion(chars):
            reason = "brace expansion"
        elif chars and chars[0] == ("~", False) and (is_name or _tilde_prefix(chars)):
            reason = "tilde expansion"
        if reason is not None:
            self.problem(f"{reason} in {where} `{_snip(word)}` cannot be resolved statically")
            return False
        return True

    def resolve_word(self, nodes: list[Node], argv: bool) -> _Segs | None:
        out: _Segs = []
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

    def word(self, node: Node, argv: bool) -> _Segs | None:
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

    def w_word(self, node: Node, argv: bool) -> _Segs | None:
        self.cover(node)
        segs = _unescape(self.text(node))
        if segs is None:
            self.problem(f"cannot read the word `{_snip(self.text(node))}`")
        return segs

    def w_literal(self, node: Node, argv: bool) -> _Segs | None:
        self.cover(node)
        text = self.text(node)
        if "`" in text or re.search(r"\$[({\[]", text):
            self.problem(f"unparsed expansion in `{_snip(text)}`")
            return None
        return [(text, node.type == "regex")]

    def w_raw_string(self, node: Node, argv: bool) -> _Segs | None:
        self.cover(node)
        text = self.text(node)
        if len(text) < 2 or text[0] != "'" or text[-1] != "'":
            self.unsupported(node)
            return None
        return [(text[1:-1], True)]

    def w_ansi_c(self, node: Node, argv: bool) -> _Segs | None:
        self.cover(node)
        text = self.text(node)
        decoded = _ansi_c(text[2:-1]) if text.startswith("$'") and text.endswith("'") else None
        if decoded is None:
            self.problem(f"cannot decode `{_snip(text)}`")
            return None
        return [(decoded, True)]

    def w_string(self, node: Node, argv: bool) -> _Segs | None:
        """A double-quoted string, read from its raw bytes so nothing tree-sitter drops is lost."""
        kids = node.children
        if len(kids) < 2 or kids[0].type != '"' or kids[-1].type != '"':
            self.unsupported(node)
            return None
        self.cover(node)
        out: _Segs = []
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

    def flush_dq(self, raw: list[str], out: _Segs) -> bool:
        text = "".join(raw)
        raw.clear()
        literal = _dq_literal(text)
        if literal is None:
            self.problem(f"unparsed expansion inside quotes: `{_snip(text)}`")
            return False
        if literal:
            out.append((literal, True))
        return True

    def w_concatenation(self, node: Node, argv: bool) -> _Segs | None:
        kids = node.children
        for a, b in itertools.pairwise(kids):
            if a.end_byte != b.start_byte:
                self.problem(f"cannot read the word `{_snip(self.text(node))}`")
                self.collect(node)
                return None
        return self.resolve_word(kids, argv)

    def w_expansion(self, node: Node, argv: bool) -> _Segs | None:
        for child in node.children:
            if child.type == "string":
                self.w_string(child, argv=False)
            else:
                self.collect(child)
        text = _snip(self.text(node))
        if argv:
            self.problem(f"`{text}` is an expansion whose value is only known at run time")
        elif node.type == "expansion" and not _safe_expansion(node):
            self.problem(f"`{text}` may evaluate arithmetic or indirection, which is not supported")
        return None

    def w_substitution(self, node: Node, argv: bool) -> _Segs | None:
        self.substitution(node)
        if argv:
            text = _snip(self.text(node))
            self.problem(f"`{text}` is only known at run time (it runs a command)")
        return None

    def w_arithmetic(self, node: Node, argv: bool) -> _Segs | None:
        self.problem(f"arithmetic expansion is not supported: `{_snip(self.text(node))}`")
        self.collect(node)
        return None

    def w_brace(self, node: Node, argv: bool) -> _Segs | None:
        self.cover(node)
        if argv:
            self.problem(f"brace expansion `{_snip(self.text(node))}` is not supported")
        return None

    def substitution(self, node: Node) -> None:
        kids = node.children
        if len(kids) < 2 or kids[0].is_named or kids[-1].is_named:
            self.unsupported(node)
            return
        if kids[0].type == "`" and "\\" in self.text(node):
            self.problem("backslashes inside backticks change how the command is read; use $(…)")
        self.cover(kids[0])
        self.cover(kids[-1])
        for child in kids[1:-1]:
            if child.is_named:
                self.statement(child)
            elif child.type in _TOKENS:
                self.cover(child)
            else:
                self.unsupported(child)

    # -- commands and wrappers ------------------------------------------------------------------

    def emit(self, argv: list[str], ctx: _Ctx) -> None:
        """Record a command, first peeling any wrapper that runs another command."""
        name = argv[0]
        if ctx.placeholder and ctx.placeholder in name:
            self.problem(f"the program `{name}` is only filled in at run time")
            return
        base = _wrapper_name(name)
        handler = _WRAPPERS.get(base) if base is not None else None
        if handler is None:
            self.add(argv, ctx)
        else:
            handler(self, argv, ctx)

    def add(self, argv: list[str], ctx: _Ctx) -> None:
        if argv[0] in ("[", "[[", "test"):
            for i, word in enumerate(argv[:-1]):
                if word in ("-v", "-R") and not _NAME.match(argv[i + 1]):
                    self.problem(f"`{word} {argv[i + 1]}` evaluates a subscript as arithmetic")
                    return
                arith = argv[0] == "[[" and word in _ARITH_TEST_OPS
                if arith and not (_INTEGER.match(argv[i - 1]) and _INTEGER.match(argv[i + 1])):
                    self.problem("`[[ … -eq … ]]` on non-numbers evaluates arithmetic")
                    return
        self.commands.append(SimpleCommand(tuple(argv), ctx.wrappers))

    def nested(self, code: str, ctx: _Ctx, label: str) -> None:
        """Parse a string the shell will parse again (``sh -c``, ``eval``, ``watch``)."""
        if ctx.placeholder and ctx.placeholder in code:
            self.problem(f"`{label}` code contains `{ctx.placeholder}`, filled in at run time")
            return
        if self.depth >= MAX_DEPTH:
            self.problem(f"commands nested more than {MAX_DEPTH} levels deep")
            return
        inner = _analyse(code, self.depth + 1, (*ctx.wrappers, label))
        self.commands.extend(inner.commands)
        self.problems.extend(f"in `{label}` string: {p}" for p in inner.problems)

    def wrapped(self, argv: list[str], start: int, ctx: _Ctx, label: str) -> None:
        """Continue with the command that starts at ``argv[start]``."""
        if start >= len(argv):
            self.problem(f"cannot tell which command `{_snip(shlex.join(argv))}` runs")
            return
        self.emit(argv[start:], ctx.wrap(label))


# --------------------------------------------------------------------------------------------
# Wrappers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Opts:
    """An option grammar: which short/long options take a value, which make it not a wrapper."""

    flags: str = ""
    valued: str = ""
    long_flags: frozenset[str] = frozenset()
    long_valued: frozenset[str] = frozenset()
    plain: str = ""  # short options that mean "this is not running a command"
    operands: int = 0  # words between the options and the command (timeout's DURATION)


def _skip_options(argv: list[str], opts: _Opts) -> tuple[int, set[str]] | str:
    """Index of the first operand and the options seen, or an error message."""
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return i + 1, seen
        if arg.startswith("--"):
            key = arg.split("=", 1)[0]
            if key in opts.long_flags and "=" not in arg:
                i += 1
            elif key in opts.long_valued:
                i += 1 if "=" in arg else 2
            else:
                return f"unsupported option `{arg}`"
            seen.add(key)
            continue
        if not arg.startswith("-") or arg == "-":
            return i, seen
        for j, ch in enumerate(arg[1:], start=1):
            seen.add(ch)
            if ch in opts.valued:
                i += 1 if j + 1 < len(arg) else 2
                break
            if ch not in opts.flags and ch not in opts.plain:
                return f"unsupported option `{arg}`"
        else:
            i += 1
    return i, seen


def _simple_wrapper(label: str, opts: _Opts) -> Callable[[_Walker, list[str], _Ctx], None]:
    def handle(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
        result = _skip_options(argv, opts)
        if isinstance(result, str):
            walker.problem(f"`{argv[0]}`: {result}")
            return
        start, seen = result
        if any(ch in seen for ch in opts.plain):
            walker.add(argv, ctx)  # e.g. `command -v x`: runs nothing
            return
        if label == "exec" and start >= len(argv) and not ctx.appended:
            return  # `exec 2>&1`: only redirections
        walker.wrapped(argv, start + opts.operands, ctx, label)

    return handle


def _nice(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    if len(argv) > 1 and re.fullmatch(r"-[0-9]+", argv[1]):
        walker.wrapped(argv, 2, ctx, "nice")
    else:
        _NICE(walker, argv, ctx)


_NICE = _simple_wrapper("nice", _Opts(valued="n", long_valued=frozenset({"--adjustment"})))

_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "ash", "mksh"})
_SHELL_O = frozenset({"pipefail", "errexit", "nounset", "xtrace"})


def _shell(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    base = _wrapper_name(argv[0]) or argv[0]
    has_c, i = False, 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        takes_o = arg.endswith("o")  # `-o pipefail`, `-euo pipefail`
        flags = arg[1:-1] if takes_o else arg[1:]
        if not set(flags) <= set("ceuxvl") or (
            takes_o and (i + 1 >= len(argv) or argv[i + 1] not in _SHELL_O)
        ):
            walker.problem(f"`{base} {arg}` is not supported; only `{base} -c '…'` is")
            return
        has_c = has_c or "c" in flags
        i += 2 if takes_o else 1
    if not has_c or i >= len(argv):
        walker.problem(f"`{base}` reading a script or stdin cannot be checked; use `{base} -c`")
        return
    walker.nested(argv[i], ctx, f"{base} -c")


def _eval(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    start = 2 if len(argv) > 1 and argv[1] == "--" else 1
    if ctx.appended:
        walker.problem("`eval` with words appended at run time cannot be checked")
    elif start < len(argv):
        walker.nested(" ".join(argv[start:]), ctx, "eval")


def _env(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    opts = _Opts(
        flags="i0",
        valued="uC",
        long_flags=frozenset({"--ignore-environment", "--null"}),
        long_valued=frozenset({"--unset", "--chdir"}),
    )
    result = _skip_options(argv, opts)
    if isinstance(result, str):
        walker.problem(f"`env`: {result}")
        return
    i = result[0]
    while i < len(argv) and "=" in argv[i] and _NAME.match(argv[i].split("=", 1)[0]):
        name = argv[i].split("=", 1)[0]
        if _dangerous_env(name):
            walker.problem(f"setting `{name}` can change which program runs, so it is not allowed")
        i += 1
    if i >= len(argv) and not ctx.appended:
        walker.add(argv, ctx)  # plain `env`: prints the environment
    else:
        walker.wrapped(argv, i, ctx, "env")


_XARGS_OPTS = _Opts(
    flags="0rtpxo",
    valued="adEILnPs",
    long_flags=frozenset(
        {"--null", "--no-run-if-empty", "--verbose", "--interactive", "--exit", "--open-tty"}
    ),
    long_valued=frozenset(
        {"--arg-file", "--delimiter", "--max-args", "--max-procs", "--max-chars",
         "--process-slot-var"}
    ),
)  # fmt: skip


def _xargs(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    """``xargs [opts] [cmd [args]]``: the command runs with input words appended (or put in)."""
    placeholder: str | None = None
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        key = arg.split("=", 1)[0]
        i += 1
        if arg == "--":
            break
        if key in ("--replace", "-i") or (arg.startswith("-i") and not arg.startswith("--")):
            placeholder = arg.split("=", 1)[1] if "=" in arg else arg[2:]  # optional value
            placeholder = placeholder or "{}"
        elif arg.startswith(("-e", "-l", "--eof", "--max-lines")):
            pass  # optional value, attached if present
        elif arg.startswith("-I"):
            placeholder = arg[2:] or (argv[i] if i < len(argv) else None)
            i += 0 if arg[2:] else 1
        else:
            result = _skip_options(["xargs", arg, *argv[i : i + 1]], _XARGS_OPTS)
            if isinstance(result, str):
                walker.problem(f"`xargs`: {result}")
                return
            i += result[0] - 2  # 1 more if the option took the next word as its value
    inner = argv[i:] if i < len(argv) else ["echo"]
    walker.emit(inner, ctx.wrap("xargs", placeholder, appended=True))


_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    walker.add(argv, ctx)
    i = 1
    while i < len(argv):
        if argv[i] not in _FIND_EXEC:
            i += 1
            continue
        action, j = argv[i], i + 1
        while j < len(argv) and not (argv[j] == ";" or (argv[j] == "+" and argv[j - 1] == "{}")):
            j += 1
        if j >= len(argv):
            walker.problem(f"`find {action}` without a terminating `;` or `+`")
            return
        if j == i + 1:
            walker.problem(f"`find {action}` without a command")
            return
        plus = argv[j] == "+"
        label = f"find {action} +" if plus else f"find {action}"
        walker.emit(argv[i + 1 : j], ctx.wrap(label, "{}", appended=plus))
        i = j + 1


_SUDO_OPTS = _Opts(
    flags="AbEHknPS",
    valued="CDghprtTUu",
    plain="lvKV",
    long_flags=frozenset(
        {"--askpass", "--background", "--preserve-env", "--set-home", "--non-interactive",
         "--preserve-groups", "--stdin", "--reset-timestamp"}
    ),
    long_valued=frozenset(
        {"--user", "--group", "--chdir", "--close-from", "--host", "--prompt", "--role",
         "--type", "--command-timeout", "--other-user", "--chroot"}
    ),
)  # fmt: skip


def _privileged(label: str, opts: _Opts) -> Callable[[_Walker, list[str], _Ctx], None]:
    def handle(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
        words = [w.split("=", 1)[0] if w.startswith("--preserve-env=") else w for w in argv]
        result = _skip_options(words, opts)
        if isinstance(result, str):
            walker.problem(f"`{label}`: {result}")
        elif any(ch in result[1] for ch in opts.plain):
            walker.add(argv, ctx)
        else:
            walker.wrapped(argv, result[0], ctx, label)

    return handle


def _watch(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    opts = _Opts(
        flags="bcdegtxpwrC",
        valued="nq",
        long_flags=frozenset(
            {"--beep", "--color", "--differences", "--errexit", "--chgexit", "--no-title",
             "--exec", "--precise", "--no-wrap", "--no-linewrap", "--no-rerun"}
        ),
        long_valued=frozenset({"--interval"}),
    )  # fmt: skip
    result = _skip_options(argv, opts)
    if isinstance(result, str):
        walker.problem(f"`watch`: {result}")
        return
    start, seen = result
    if "x" in seen or "--exec" in seen:
        walker.wrapped(argv, start, ctx, "watch")
    elif ctx.appended:
        walker.problem("`watch` with words appended at run time cannot be checked")
    elif start >= len(argv):
        walker.problem("`watch` without a command")
    else:
        walker.nested(" ".join(argv[start:]), ctx, "watch")


def _flock(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    opts = _Opts(
        flags="sxenuoF",
        valued="wE",
        long_flags=frozenset(
            {"--shared", "--exclusive", "--nonblock", "--nb", "--unlock", "--close",
             "--no-fork", "--verbose"}
        ),
        long_valued=frozenset({"--timeout", "--wait", "--conflict-exit-code"}),
    )  # fmt: skip
    result = _skip_options(argv, opts)
    if isinstance(result, str):
        walker.problem(f"`flock`: {result}")
        return
    lock = result[0]
    if lock + 1 < len(argv) and argv[lock + 1] in ("-c", "--command"):
        if lock + 2 >= len(argv):
            walker.problem("`flock -c` without a command")
        else:
            walker.nested(argv[lock + 2], ctx, "flock -c")
    elif lock + 1 >= len(argv) and not ctx.appended:
        walker.add(argv, ctx)  # `flock FD`: locks a descriptor, runs nothing
    else:
        walker.wrapped(argv, lock + 1, ctx, "flock")


def _coproc(walker: _Walker, argv: list[str], ctx: _Ctx) -> None:
    walker.problem("`coproc` is not supported")


_WRAPPERS: dict[str, Callable[[_Walker, list[str], _Ctx], None]] = {
    **dict.fromkeys(_SHELLS, _shell),
    "eval": _eval,
    "env": _env,
    "xargs": _xargs,
    "find": _find,
    "sudo": _privileged("sudo", _SUDO_OPTS),
    "doas": _privileged("doas", _Opts(flags="n", valued="u")),
    "watch": _watch,
    "flock": _flock,
    "nice": _nice,
    "coproc": _coproc,
    "nohup": _simple_wrapper("nohup", _Opts()),
    "builtin": _simple_wrapper("builtin", _Opts()),
    "unbuffer": _simple_wrapper("unbuffer", _Opts(flags="p")),
    "exec": _simple_wrapper("exec", _Opts(flags="cl", valued="a")),
    "command": _simple_wrapper("command", _Opts(flags="p", plain="vV")),
    "setsid": _simple_wrapper(
        "setsid", _Opts(flags="cfw", long_flags=frozenset({"--ctty", "--fork", "--wait"}))
    ),
    "stdbuf": _simple_wrapper(
        "stdbuf", _Opts(valued="ioe", long_valued=frozenset({"--input", "--output", "--error"}))
    ),
    "timeout": _simple_wrapper(
        "timeout",
        _Opts(
            flags="v",
            valued="sk",
            long_flags=frozenset({"--preserve-status", "--foreground", "--verbose"}),
            long_valued=frozenset({"--signal", "--kill-after"}),
            operands=1,
        ),
    ),
    "time": _simple_wrapper(
        "time",
        _Opts(
            flags="pavq",
            valued="fo",
            long_flags=frozenset({"--append", "--verbose", "--portability", "--quiet"}),
            long_valued=frozenset({"--format", "--output"}),
        ),
    ),
    "chroot": _simple_wrapper(
        "chroot",
        _Opts(
            long_flags=frozenset({"--skip-chdir"}),
            long_valued=frozenset({"--userspec", "--groups"}),
            operands=1,
        ),
    ),
    "ionice": _simple_wrapper(
        "ionice",
        _Opts(
            flags="t",
            valued="cn",
            plain="pPu",
            long_flags=frozenset({"--ignore"}),
            long_valued=frozenset({"--class", "--classdata"}),
        ),
    ),
    "taskset": _simple_wrapper(
        "taskset",
        _Opts(flags="ac", plain="p", long_flags=frozenset({"--all-tasks", "--cpu-list"}),
              operands=1),
    ),
}  # fmt: skip

_PRIVILEGED = frozenset({"sudo", "doas"})


def _wrapper_name(name: str) -> str | None:
    """The wrapper a command name refers to: bare names and system paths only, not ./timeout."""
    if "/" not in name:
        return name
    directory, _, base = name.rpartition("/")
    return base if directory in _SYSTEM_DIRS else None


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

_WORDS: dict[str, Callable[[_Walker, Node, bool], _Segs | None]] = {
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


# --------------------------------------------------------------------------------------------
# Word helpers
# --------------------------------------------------------------------------------------------


def _unescape(raw: str) -> _Segs | None:
    """Backslash removal for an unquoted word; ``None`` if it holds unparsed quoting."""
    out: _Segs = []
    buf: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "\\" and i + 1 < n:
            if raw[i + 1] != "\n":
                if buf:
                    out.append(("".join(buf), False))
                    buf.clear()
                out.append((raw[i + 1], True))
            i += 2
            continue
        if c in "$`'\"":
            return None
        buf.append(c)
        i += 1
    if buf:
        out.append(("".join(buf), False))
    return out


def _dq_literal(raw: str) -> str | None:
    """Backslash removal inside double quotes; ``None`` if an expansion hides in the text."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        nxt = raw[i + 1] if i + 1 < n else ""
        if c == "\\" and nxt:
            if nxt in '$`"\\':
                out.append(nxt)
            elif nxt != "\n":
                out.append("\\" + nxt)
            i += 2
            continue
        if c == "`" or (c == "$" and nxt and (nxt in "({[_@*#?$!-" or nxt.isalnum())):
            return None
        out.append(c)
        i += 1
    return "".join(out)


_ANSI_SIMPLE = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
    "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip
_ANSI_NUMERIC = re.compile(r"[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}")


def _ansi_c(body: str) -> str | None:
    """Decode the inside of ``$'…'``; ``None`` for a NUL (bash truncates there) or bad escape."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ANSI_SIMPLE:
            out.append(_ANSI_SIMPLE[nxt])
            i += 2
        elif nxt == "c" and i + 2 < n and body[i + 2] != "\\":
            out.append(chr(0x7F if body[i + 2] == "?" else ord(body[i + 2]) & 0x1F))
            i += 3
        elif m := _ANSI_NUMERIC.match(body, i + 1):
            digits = m.group()
            code = int(digits, 8) if digits[0] in "01234567" else int(digits[1:], 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                return None
            out.append(chr(code))
            i = m.end()
        elif nxt == "c":
            return None
        else:
            out.append("\\" + nxt)
            i += 2
    text = "".join(out)
    return None if "\0" in text else text


def _has_brace_expansion(chars: list[tuple[str, bool]]) -> bool:
    """An unquoted ``{…,…}`` or ``{a..b}``: the word becomes several words."""
    for start, (ch, quoted) in enumerate(chars):
        if ch != "{" or quoted:
            continue
        depth = 0
        for k in range(start, len(chars)):
            c, q = chars[k]
            if q:
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            elif depth == 1 and (
                c == "," or (c == "." and k + 1 < len(chars) and chars[k + 1] == (".", False))
            ):
                return True
    return False


def _tilde_prefix(chars: list[tuple[str, bool]]) -> bool:
    """``~user``, ``~+``, ``~-``, ``~1``: a tilde prefix other than the home directory."""
    for ch, quoted in chars[1:]:
        if ch == "/" and not quoted:
            return False
        return not quoted  # a quoted character stops tilde expansion: the word is literal
    return False


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


def _analyse(source: str, depth: int, wrappers: tuple[str, ...]) -> Parsed:
    try:
        src = source.encode("utf-8")
    except UnicodeEncodeError:
        return Parsed((), ("the command is not valid text",))
    if len(src) > MAX_SOURCE_BYTES:
        return Parsed((), (f"the command is longer than {MAX_SOURCE_BYTES} bytes",))
    if b"\0" in src:
        return Parsed((), ("the command contains a NUL byte",))
    with _PARSER_LOCK:
        tree = _parser().parse(src)
    walker = _Walker(src, depth, wrappers)
    root = tree.root_node
    if root.has_error:
        walker.problem("the command is incomplete or has a syntax error")
    walker.statement(root)
    walker.check_coverage()
    problems = tuple(dict.fromkeys(walker.problems))
    return Parsed(tuple(walker.commands), problems)


def parse(source: str) -> Parsed:
    """Every simple command ``source`` would run, and anything that could not be accounted for."""
    return _analyse(source, 0, ())


def check_scope(source: str, patterns: Sequence[str]) -> ScopeVerdict:
    """Allow ``source`` only if it is fully understood and every command matches a pattern.

    A command reached through ``sudo``/``doas`` must match with the privilege word in front
    (``sudo kubectl *``); one whose trailing words are appended at run time (``xargs``,
    ``find -exec … +``) must match a pattern ending in ``*``. Raises ValueError for a bad pattern.
    """
    compiled = [parse_pattern(p) for p in patterns]
    allowed = ", ".join(patterns) if patterns else "none"
    parsed = parse(source)
    for cmd in parsed.commands:
        if not _command_allowed(cmd, compiled):
            text = shlex.join(_subject(cmd))
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


def _subject(cmd: SimpleCommand) -> tuple[str, ...]:
    """The words a command is matched as: ``sudo`` stays in front of what it runs."""
    privileged = next((w for w in cmd.wrappers if w in _PRIVILEGED), None)
    return cmd.argv if privileged is None else (privileged, *cmd.argv)


def _command_allowed(cmd: SimpleCommand, patterns: Sequence[Pattern]) -> bool:
    appended = any(w == "xargs" or w.endswith(" +") for w in cmd.wrappers)
    subject = _subject(cmd)
    return any(p.matches(subject) and (p.rest or not appended) for p in patterns)
