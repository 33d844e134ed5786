"""Words of a shell command: quote removal, escapes, and what the shell would expand.

Helpers of `policy.shell` that look at text only (no syntax tree): backslash and quote removal,
``$'…'`` decoding, brace and tilde expansion, and characters that only look like shell syntax.
"""

from __future__ import annotations

import re
import unicodedata

Segs = list[tuple[str, bool]]
"""(text, quoted) pieces of one word: what the shell would expand is in the unquoted pieces."""


def snip(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters for a message."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unescape(raw: str) -> Segs | None:
    """Backslash removal for an unquoted word; ``None`` if it holds unparsed quoting."""
    out: Segs = []
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


def dq_literal(raw: str) -> str | None:
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


def ansi_c(body: str) -> str | None:
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


def has_brace_expansion(chars: list[tuple[str, bool]]) -> bool:
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


def tilde_prefix(chars: list[tuple[str, bool]]) -> bool:
    """``~user``, ``~+``, ``~-``, ``~1``: a tilde prefix other than the home directory."""
    for ch, quoted in chars[1:]:
        if ch == "/" and not quoted:
            return False
        return not quoted  # a quoted character stops tilde expansion: the word is literal
    return False


def has_glob(chars: list[tuple[str, bool]]) -> bool:
    """An unquoted ``*``, ``?`` or ``[…]``: the shell replaces the word with matching file names."""
    opened = False
    for ch, quoted in chars:
        if quoted:
            continue
        if ch in "*?":
            return True
        if ch == "[":
            opened = True
        elif ch == "]" and opened:
            return True
    return False


_CONTROL = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")  # \t \n \r are the parser's concern
# Letters that look like shell syntax (a pipe, a bang, a quote) without being punctuation
_CONFUSABLE_LETTERS = frozenset("\u01c0\u01c1\u01c3\u02b9\u02bb\u02bc\u02bd\u02c8\u02cb\u02d0")


def lookalike(text: str) -> str | None:
    """The first character of ``text`` that only looks like ASCII shell syntax or hides text:
    a non-ASCII space, dash, quote, semicolon, bar or other punctuation or symbol, a character
    whose compatibility form is ASCII (fullwidth ``；``), an invisible or bidi format character,
    a combining mark on an ASCII character, an ASCII control character. ``None`` if there is none.

    Such characters mislead the person who reads or approves a command (docs/explanation/
    governance.md), so a command holding one is not run, whatever the shell would make of it."""
    if text.isascii() and _CONTROL.search(text) is None:
        return None
    previous = ""
    for ch in text:
        if ch.isascii():
            if _CONTROL.match(ch):
                return f"the control character U+{ord(ch):04X}"
            previous = ch
            continue
        category = unicodedata.category(ch)
        if (
            category[0] in "ZCPS"
            or ch in _CONFUSABLE_LETTERS
            or unicodedata.normalize("NFKC", ch).isascii()
            or (category[0] == "M" and previous.isascii() and previous != "")
        ):
            name = unicodedata.name(ch, "an unnamed character")
            return f"U+{ord(ch):04X} {name}"
        previous = ch
    return None
