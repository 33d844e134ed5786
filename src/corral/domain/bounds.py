"""The bounds of every number and every nesting Corral accepts, in one place.

The CLI, the submission service (services/submissions.py), the core protocol (core/protocol.py)
and the configuration loader all check against these, so that a value no sane job has — an
infinite or NaN timeout, a negative budget, a 100,000-deep JSON or YAML nesting — is a one-line
error where it enters, never a crash further in (docs/reference/cli.md lists the bounds).
"""

from __future__ import annotations

import json
import math
from itertools import accumulate
from typing import Any

from corral.domain.errors import InvalidRequest
from corral.domain.models import Limits

# Per attempt
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # 30 days: an attempt's deadline
MAX_GRACE_S = 3600.0  # between SIGTERM and SIGKILL
MAX_ATTEMPTS = 100
MAX_TOOL_CALLS = 1_000_000
MAX_TOKENS = 10**12  # a token budget, in or out
MAX_EXPIRES_S = 366 * 24 * 3600.0  # a kill switch that lifts by itself, a wait
MIN_OUTPUT_BYTES, MAX_OUTPUT_BYTES = 64 << 10, 1 << 40  # an attempt's output cap: 64 KiB … 1 TiB
# Money: a budget or a reported cost
MAX_USD = 1e9
# Job fields
MIN_PRIORITY, MAX_PRIORITY = 0, 4
MAX_PROMPT_BYTES = 1 << 19  # 512 KiB: a job, prompt included, fits one core protocol line
# Nesting: a JSON request on a socket or the core protocol; a YAML configuration
MAX_JSON_DEPTH = 128
MAX_YAML_DEPTH = 64


class BoundError(InvalidRequest, ValueError):
    """A value outside its documented bounds; the message names it, its bounds and the value."""


def _show(value: float) -> str:
    """2592000 rather than 2.592e+06; 0.5 as is."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def number(
    name: str, value: Any, *, low: float, high: float, low_open: bool = False, unit: str = ""
) -> float:
    """`value` as a finite float within [low, high] ((low, high] when `low_open`), or
    BoundError: `timeout must be a finite number of seconds > 0 and ≤ 2592000, got inf`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    inside = (v > low if low_open else v >= low) and v <= high
    if not (math.isfinite(v) and inside):
        what = f"a finite number{' of ' + unit if unit else ''}"
        raise BoundError(
            f"{name} must be {what} {'>' if low_open else '≥'} {_show(low)} and "
            f"≤ {_show(high)}, got {value!r}"
        )
    return v


def integer(name: str, value: Any, *, low: int, high: int) -> int:
    """`value` as an int within [low, high], or BoundError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise BoundError(f"{name} must be a whole number {low} … {high}, got {value!r}")
    v = int(value)
    if not low <= v <= high:
        raise BoundError(f"{name} must be {low} … {high}, got {v}")
    return v


def text(name: str, value: str | None, *, required: bool = True) -> str | None:
    """A name given on the command line or the wire: an empty or blank one is refused."""
    if value is None:
        return None
    if required and not value.strip():
        raise BoundError(f"{name} must not be empty")
    return value


def json_depth(data: bytes | str) -> int:
    """How deeply a JSON text nests its arrays and objects, without parsing it (brackets
    inside strings are not counted): a cheap scan that bounds what json.loads may recurse."""
    raw = data.encode() if isinstance(data, str) else data
    if b"[" not in raw and b"{" not in raw:
        return 0
    if b'"' in raw:
        raw = _strip_strings(raw)
    brackets = raw.translate(None, _NOT_BRACKETS)
    return max(accumulate(1 if b in b"[{" else -1 for b in brackets), default=0)


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _strip_strings(raw: bytes) -> bytes:
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        q = raw.find(b'"', i)
        if q < 0:
            out += raw[i:]
            break
        out += raw[i:q]
        j = q + 1
        while True:  # the closing quote: one not escaped by an odd run of backslashes
            j = raw.find(b'"', j)
            if j < 0:
                return bytes(out)
            k = j
            while raw[k - 1] == 0x5C:  # backslash
                k -= 1
            if (j - k) % 2 == 0:
                break
            j += 1
        i = j + 1
    return bytes(out)


def loads_bounded(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, or BoundError when the text nests deeper than `max_depth`. A text with no
    more opening brackets than that cannot nest deeper (a count in C), so only one that has is
    scanned (every line between the engine and its core is parsed here)."""
    opens = (
        data.count(b"[") + data.count(b"{")
        if isinstance(data, bytes)
        else (data.count("[") + data.count("{"))
    )
    if opens > max_depth and (depth := json_depth(data)) > max_depth:
        raise BoundError(f"JSON nested {depth} levels deep (at most {max_depth})")
    return json.loads(data)


def check_limits(limits: Limits) -> Limits:
    """A job's limits within their bounds (each number finite), or BoundError naming one."""
    return Limits(
        max_attempts=integer("max attempts", limits.max_attempts, low=1, high=MAX_ATTEMPTS),
        timeout_s=number(
            "timeout", limits.timeout_s, low=0, high=MAX_TIMEOUT_S, low_open=True, unit="seconds"
        ),
        grace_s=number("grace", limits.grace_s, low=0, high=MAX_GRACE_S, unit="seconds"),
        max_tool_calls=integer("max tool calls", limits.max_tool_calls, low=0, high=MAX_TOOL_CALLS),
        token_budget_in=integer("token budget in", limits.token_budget_in, low=0, high=MAX_TOKENS),
        token_budget_out=integer(
            "token budget out", limits.token_budget_out, low=0, high=MAX_TOKENS
        ),
    )


def usd(name: str, value: Any) -> float:
    """An amount of money (a budget, a cost): finite, not negative, at most MAX_USD."""
    return number(name, value, low=0, high=MAX_USD, unit="USD")


def yaml_too_deep(text: str, max_depth: int = MAX_YAML_DEPTH) -> str | None:
    """Where a YAML text nests its sequences and mappings deeper than `max_depth` (`line N:
    nested deeper than 64 levels`), or None. libyaml's event parser keeps its own stack, so
    this reads a 100,000-deep flow sequence without recursing, and stops at the bound;
    building the document from it would overflow the C stack. Malformed YAML is left to the
    loader to report."""
    import yaml  # only the configuration loaders need it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
                depth += 1
                if depth > max_depth:
                    mark = event.start_mark
                    at = f"line {mark.line + 1}: " if mark is not None else ""
                    return f"{at}nested deeper than {max_depth} levels"
            elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
                depth -= 1
    except yaml.YAMLError as err:
        # libyaml (0.2.6 and later) scans a flow collection's tokens ahead and refuses one
        # past its own nesting bound before the parser yields the events counted above
        if "nesting depth" in str(err):
            mark = getattr(err, "problem_mark", None)
            at = f"line {mark.line + 1}: " if mark is not None else ""
            return f"{at}nested deeper than {max_depth} levels"
        return None
    return None
