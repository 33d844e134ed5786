"""Secret redaction: what an agent prints, types or is given never reaches the store or the logs.

Two nets. Values known to be secret (environment values marked secret, the provider API keys a
worker is given, the secrets found in a submission) are replaced wherever they appear, verbatim.
Shapes of well-known credentials (provider API keys, cloud access keys, bearer tokens, private
keys, `password=…` assignments, credentials in URLs) are replaced even when nobody declared them.

The patterns run on RE2 (linear time): the redactor reads what jobs print, which nobody vets, and
a backtracking engine can be made to take quadratic time by one long line. `StreamRedactor` does
the same on a byte stream written in pieces (an attempt's output, workers/pump.py), holding back
a bounded tail so that a secret split across two writes is still caught (docs/how-to/secrets.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import re2

# The output pump imports this module at every start: `typing` (and `re` with it) would cost
# it a third of its start-up, so the annotations' `Any` is for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARK = "[REDACTED]"
MIN_SECRET_LEN = 6  # shorter declared values would blank out ordinary words
# How much of a line without end a stream holds back for a secret that may continue in the next
# write: a secret (or credential shape) up to this long is caught wherever the writes split it.
HOLD = 4096
# A private-key block longer than this (no PEM private key is) ends the block: a `BEGIN` line
# without its `END` must not swallow the rest of a job's output.
MAX_KEY_BLOCK = 64 << 10

_KEY_BEGIN = r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
_KEY_END = r"-----END [A-Z0-9 ]*PRIVATE KEY-----"
# Credential shapes, as one alternation so a text is scanned once. In a shape with a group
# `v<n>`, only that group (the value) is replaced; otherwise the whole match is.
_SHAPE_SOURCES = (
    _KEY_BEGIN + r"(?s:.*?)(?:" + _KEY_END + r"|\z)",
    r"\b(?:sk|rk|pk)-(?:[a-z]+-)?[A-Za-z0-9_\-]{16,}",  # OpenAI, Anthropic (sk-ant-…), Stripe
    r"\bgh[pousr]_[A-Za-z0-9]{20,}\b|\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bAIza[0-9A-Za-z_\-]{35}\b",  # Google API keys
    r"\bglpat-[A-Za-z0-9_\-]{20,}",  # GitLab
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"(?i:\bbearer\s+)(?P<v1>[A-Za-z0-9._~+/\-]{12,}=*)",
    r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]+:(?P<v2>[^\s/@]{3,})@",  # scheme://user:pw@host
    # NAME=value / "name": "value" where the name ends in a word that says it holds a secret
    # (`GITHUB_TOKEN`, `api_key`, `password`; not `maxOutputTokens` nor `input_tokens`); numbers
    # and JSON literals are left alone (`_literal`), so a JSON line stays JSON.
    r"[\w.\-]*(?i:api[_\-]?key|secret|token|passw(?:or)?d|pwd|credentials?"
    r"|private[_\-]?key)\"?\s*[:=]\s*\"?(?P<v3>[^\s\"',;&]{4,})",
)
_SHAPES_SOURCE = "|".join(f"(?:{p})" for p in _SHAPE_SOURCES)
_SHAPES = re2.compile(_SHAPES_SOURCE)
_SHAPES_B = re2.compile(_SHAPES_SOURCE.encode())
_KEY_BEGIN_B = re2.compile(_KEY_BEGIN.encode())
_KEY_END_B = re2.compile(_KEY_END.encode())
_LITERAL = re2.compile(r"^(?:\d+|true|false|null)\b")
_LITERAL_B = re2.compile(rb"^(?:\d+|true|false|null)\b")
_VALUE_GROUPS = tuple(_SHAPES.groupindex[g] for g in ("v1", "v2", "v3"))
_V3 = _SHAPES.groupindex["v3"]
_MARK_B = MARK.encode()


def _replace(m: Any) -> Any:
    """The replacement of one shape match: the whole match, or only its value group."""
    whole = m.group(0)
    mark: str | bytes = MARK if isinstance(whole, str) else _MARK_B
    for group in _VALUE_GROUPS:
        start, end = m.span(group)
        if start < 0:
            continue
        value = m.group(group)
        literal = _LITERAL if isinstance(value, str) else _LITERAL_B
        if group == _V3 and literal.search(value):
            return whole  # `"token": 300`, `"token": null`: a count or a literal, not a secret
        base = m.start()
        return whole[: start - base] + mark + whole[end - base :]
    return mark


def _values_pattern(values: Iterable[str]) -> tuple[Any, Any] | None:
    kept = sorted({s for s in values if s and len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
    if not kept:  # longest first: a secret containing another is replaced whole
        return None
    source = "|".join(re2.escape(v) for v in kept)
    return re2.compile(source), re2.compile(source.encode())


class Redactor:
    """Replaces declared secret values and credential shapes with `[REDACTED]`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.values = tuple(sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LEN}))
        compiled = _values_pattern(self.values)
        self._values: Any = compiled[0] if compiled else None
        self._values_b: Any = compiled[1] if compiled else None

    def text(self, s: str) -> str:
        if self._values is not None:
            s = self._values.sub(MARK, s)
        out: str = _SHAPES.sub(_replace, s)
        return out

    def data(self, b: bytes) -> bytes:
        """`text` on bytes (any encoding; the patterns are ASCII)."""
        if self._values_b is not None:
            b = self._values_b.sub(_MARK_B, b)
        out: bytes = _SHAPES_B.sub(_replace, b)
        return out

    def spans(self, b: bytes) -> list[tuple[int, int]]:
        """Where in `b` the secrets are that `data` would replace (a shape's value group when
        it has one): for masking a file in place, at the same length."""
        found: list[tuple[int, int]] = []
        if self._values_b is not None:
            found += [m.span() for m in self._values_b.finditer(b)]
        for m in _SHAPES_B.finditer(b):
            groups = [g for g in _VALUE_GROUPS if m.span(g)[0] >= 0]
            if groups and groups[0] == _V3 and _LITERAL_B.search(m.group(_V3)):
                continue
            found.append(m.span(groups[0]) if groups else m.span())
        return found

    def found(self, s: str) -> list[str]:
        """The secrets `text` would replace in `s`: declared values and the credentials the
        shapes find (a shape's value group when it has one)."""
        hits = [m.group(0) for m in self._values.finditer(s)] if self._values else []
        for m in _SHAPES.finditer(s):
            groups = [g for g in _VALUE_GROUPS if m.span(g)[0] >= 0]
            value = m.group(groups[0]) if groups else m.group(0)
            if groups and groups[0] == _V3 and _LITERAL.search(value):
                continue
            hits.append(value)
        return hits

    def obj(self, value: Any) -> Any:
        """A JSON-like value with every string in it redacted (keys included)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.obj(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.obj(v) for v in value]
        return value

    def env(self, env: Mapping[str, str], secret_keys: Iterable[str] = ()) -> dict[str, str]:
        """An environment for display: values of `secret_keys` (and of names that say they hold
        a secret) masked, the rest redacted like any text."""
        marked = set(secret_keys)
        return {
            k: MARK if k in marked or SECRET_NAME.search(k) else self.text(v)
            for k, v in env.items()
        }

    def stream(self) -> StreamRedactor:
        """A redactor for one byte stream written in pieces."""
        return StreamRedactor(self)


SECRET_NAME = re2.compile(r"(?i)api[_\-]?key|secret|token|passw(?:or)?d|pwd|credential")


class StreamRedactor:
    """Redacts a byte stream fed in pieces: `feed` returns what may be written now, `close` the
    rest. Two stages, each holding back only what the next piece could still change: declared
    values (the longest tail that begins one), then shapes (the unfinished last line, at most
    `HOLD` bytes of it, and a private-key block until its END line)."""

    def __init__(self, redactor: Redactor, hold: int = HOLD) -> None:
        self._hold = hold
        self._values = redactor._values_b
        encoded = [v.encode() for v in redactor.values]
        self._longest = max((len(v) for v in encoded), default=0)
        self._held = _prefix_test(encoded)
        self._raw = b""  # stage 1's held tail: may be the start of a declared value
        self._pending = b""  # stage 2's held tail: the unfinished line
        self._in_key = 0  # bytes swallowed so far inside a private-key block (0: outside)

    def feed(self, data: bytes) -> bytes:
        return self._shapes(self._declared(data, final=False), final=False)

    def close(self) -> bytes:
        """Everything still held, redacted: the stream has ended."""
        return self._shapes(self._declared(b"", final=True), final=True)

    def _declared(self, data: bytes, *, final: bool) -> bytes:
        buf = self._raw + data
        if self._values is None:
            self._raw = b""
            return buf
        cut = len(buf) if final else len(buf) - self._held(buf)
        # A match that reaches into the held tail could still grow into a longer value.
        for m in self._values.finditer(buf, max(0, cut - self._longest)):
            if m.start() < cut < m.end():
                cut = m.start()
                break
        self._raw = buf[cut:]
        out: bytes = self._values.sub(_MARK_B, buf[:cut])
        return out

    def _shapes(self, data: bytes, *, final: bool) -> bytes:
        buf = self._pending + data
        out = bytearray()
        while True:
            if self._in_key:
                buf, done = self._skip_key(buf, final=final)
                if done:
                    break
                continue
            begin = _KEY_BEGIN_B.search(buf)
            if begin is not None:  # the marker ends whatever line came before it
                out += _SHAPES_B.sub(_replace, buf[: begin.start()]) + _MARK_B
                buf = buf[begin.end() :]
                self._in_key = 1
                continue
            cut = len(buf) if final else self._cut(buf)
            out += _SHAPES_B.sub(_replace, buf[:cut])
            buf = buf[cut:]
            break
        self._pending = buf
        return bytes(out)

    def _skip_key(self, buf: bytes, *, final: bool) -> tuple[bytes, bool]:
        """Swallow a private-key block up to its END line: (what follows, whether to wait for
        more). A block longer than any key ends where it is, and the stream goes on."""
        end = _KEY_END_B.search(buf)
        if end is not None:
            self._in_key = 0
            return buf[end.end() :], False
        keep = 0 if final else min(len(buf), len(_KEY_END) + 32)  # an END line may be split
        self._in_key += len(buf) - keep
        tail = buf[len(buf) - keep :]
        if self._in_key <= MAX_KEY_BLOCK:
            return tail, True
        self._in_key = 0
        return tail, False

    def _cut(self, buf: bytes) -> int:
        """Where the bytes that are safe to redact and write end: after the last line break,
        unless the unfinished line is longer than the hold (then `HOLD` before the end, moved
        back to the start of a shape that the cut would split)."""
        line_end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        if len(buf) - line_end <= self._hold:
            return line_end
        cut = len(buf) - self._hold
        for m in _SHAPES_B.finditer(buf, max(line_end, cut - self._hold)):
            start: int = m.start()
            if start >= cut:
                break
            end: int = m.end()
            if end > cut:
                return start if start > line_end else end
        return cut


def _prefix_test(values: list[bytes]) -> Callable[[bytes], int]:
    """A function giving the length of the longest tail of a buffer that is a proper prefix of
    one of `values` (0 when none is): what must wait for the next piece of the stream."""
    by_first: dict[int, list[bytes]] = {}
    for v in values:
        by_first.setdefault(v[0], []).append(v)
    longest = max((len(v) for v in values), default=1) - 1

    def held(buf: bytes) -> int:
        for i in range(max(0, len(buf) - longest), len(buf)):  # the longest tail first
            candidates = by_first.get(buf[i])
            if candidates and any(v.startswith(buf[i:]) for v in candidates):
                return len(buf) - i
        return 0

    return held
