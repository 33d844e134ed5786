"""Secret redaction: what an agent prints, types or is given never reaches the store or the logs.

Two nets. Values known to be secret (environment values marked secret, the provider API keys a
worker is given) are replaced wherever they appear, verbatim. Shapes of well-known credentials
(provider API keys, cloud access keys, bearer tokens, private keys, `password=…` assignments,
credentials in URLs) are replaced even when nobody declared them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MARK = "[REDACTED]"
MIN_SECRET_LEN = 6  # shorter declared values would blank out ordinary words

# Credential shapes, as one alternation so a text is scanned once. In a shape with a group
# `v<n>`, only that group (the value) is replaced; otherwise the whole match is.
_SHAPES = re.compile("|".join(f"(?:{p})" for p in (
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    r"\b(?:sk|rk|pk)-(?:[a-z]+-)?[A-Za-z0-9_\-]{16,}",  # OpenAI, Anthropic (sk-ant-…), Stripe
    r"\bgh[pousr]_[A-Za-z0-9]{20,}\b|\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bAIza[0-9A-Za-z_\-]{35}\b",  # Google API keys
    r"\bglpat-[A-Za-z0-9_\-]{20,}",  # GitLab
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"(?i:\bbearer\s+)(?P<v1>[A-Za-z0-9._~+/\-]{12,}=*)",
    r"(?:[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/:@]+:(?P<v2>[^\s/@]{3,})@",  # scheme://user:pw@host
    # NAME=value / "name": "value" where the name ends in a word that says it holds a secret
    # (`GITHUB_TOKEN`, `api_key`, `password`; not `maxOutputTokens` nor `input_tokens`); numbers
    # and JSON literals are left alone, so a JSON line stays JSON.
    r"(?<![\w.\-])[\w.\-]*(?i:api[_\-]?key|secret|token|passw(?:or)?d|pwd|credentials?"
    r"|private[_\-]?key)\"?\s*[:=]\s*\"?(?!(?:\d+|true|false|null)\b)"
    r"(?P<v3>[^\s\"',;&]{4,})",
)))
_VALUE_GROUPS = ("v1", "v2", "v3")


class Redactor:
    """Replaces declared secret values and credential shapes with `[REDACTED]`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LEN},
                        key=len, reverse=True)  # longest first: a secret containing another
        self._values = re.compile("|".join(map(re.escape, values))) if values else None

    def text(self, s: str) -> str:
        if self._values is not None:
            s = self._values.sub(MARK, s)
        return _SHAPES.sub(_replace, s)

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
        return {k: MARK if k in marked or SECRET_NAME.search(k) else self.text(v)
                for k, v in env.items()}


SECRET_NAME = re.compile(r"(?i)api[_\-]?key|secret|token|passw(?:or)?d|pwd|credential")


def _replace(m: re.Match[str]) -> str:
    for group in _VALUE_GROUPS:
        if m.group(group) is not None:
            start, end = m.span(group)
            base = m.start()
            whole = m.group(0)
            return whole[: start - base] + MARK + whole[end - base:]
    return MARK
