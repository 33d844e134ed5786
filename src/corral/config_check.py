"""corral.yaml's problems in plain words, every one of them, in one line.

The validator's own wording ("Input should be greater than or equal to 1", "Extra inputs are not
permitted", "Value error, …") is turned into what an operator reads: `roles.build.concurrency:
must be at least 1`, `roles.build.colour: unknown key (did you mean …?)`. The semantic checks
pydantic cannot make (a misspelled worker kind) are here too, so they fail at load, not at first
use. tests/unit/test_config.py holds the cases.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

Loc = tuple[int | str, ...]

_SIMPLE = {
    "missing": "is required",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "list_type": "must be a list",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "greater_than": ("gt", "must be more than {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "less_than": ("lt", "must be less than {}"),
}
_TAG = re.compile(r"^[a-z_]+\[.*\]$")  # a union member's tag in a location: list[int], literal[…]


def plain(error: Mapping[str, Any]) -> str:
    """One validation error's message in plain words (its location excluded)."""
    kind, ctx = str(error.get("type", "")), error.get("ctx") or {}
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind in _BOUNDS:
        key, text = _BOUNDS[kind]
        bound = ctx.get(key)
        if isinstance(bound, float):  # 2592000, not 2.592e+06; 0.5 as is
            bound = int(bound) if bound.is_integer() and abs(bound) < 1e15 else f"{bound:g}"
        return text.format(bound)
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error") or error.get("msg", "")).removeprefix("Value error, ")
    message = str(error.get("msg", "is not valid"))
    message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:] if message.startswith("Input should") else message


def _tag_text(tag: str) -> str:
    """`literal['nonzero']` → `'nonzero'`, `list[int]` → `a list of int`."""
    inner = tag[tag.index("[") + 1 : -1]
    if tag.startswith("literal["):
        return inner
    items = {"int": "whole numbers", "float": "numbers", "str": "strings"}.get(inner, inner)
    return f"a {tag[: tag.index('[')]} of {items}"


def problems(
    errors: Iterable[Mapping[str, Any]], known: Mapping[Loc, Collection[str]] | None = None
) -> list[str]:
    """Every error as `where: what`, in order; the members of a union collapse into one line.

    `known`: the keys allowed at a location, for "unknown key (did you mean …?)"."""
    out: list[str] = []
    unions: dict[str, list[str]] = {}
    for e in errors:
        loc = tuple(e.get("loc") or ())
        cut = next(
            (i for i, part in enumerate(loc) if isinstance(part, str) and _TAG.match(part)), None
        )
        if cut is not None:  # one member of a union failed: say what the union accepts
            where = _where(loc[:cut])
            if where not in unions:
                unions[where] = []
                out.append(where)
            tag = _tag_text(str(loc[cut]))
            if tag not in unions[where]:
                unions[where].append(tag)
            continue
        if e.get("type") == "extra_forbidden":
            out.append(f"{_where(loc)}: {unknown_key(str(loc[-1]), (known or {}).get(loc[:-1]))}")
            continue
        out.append(f"{_where(loc)}: {plain(e)}")
    return [
        f"{line}: must be {' or '.join(unions[line])}" if line in unions else line for line in out
    ]


def unknown_key(key: str, allowed: Collection[str] | None) -> str:
    """`unknown key` with a suggestion when one of the allowed keys is close."""
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}known: {', '.join(sorted(allowed))})"


def unknown_name(what: str, name: str, allowed: Collection[str]) -> str:
    """`unknown worker kind 'claude-cde' (did you mean 'claude-code'? known: …)`."""
    close = difflib.get_close_matches(name, sorted(allowed), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {what} {name!r} ({hint}known: {', '.join(sorted(allowed))})"


def kind_problems(raw: Mapping[str, Any], adapters: Sequence[str]) -> list[str]:
    """Worker kinds the configuration (as parsed YAML) names but nothing can run: found at
    load, not when the first job of a role is submitted."""
    builtin = ("command", *adapters)
    workers = _mapping(raw.get("workers"))
    found = [
        f"workers.{name}.adapter: is required for a worker kind of your own (one of "
        f"{', '.join(builtin)})"
        for name, w in workers.items()
        if name not in builtin and not _mapping(w).get("adapter")
    ]
    kinds = {*builtin, *(n for n, w in workers.items() if _mapping(w).get("adapter"))}
    for name, role in _mapping(raw.get("roles")).items():
        role = _mapping(role)
        named = [("worker", role.get("worker", "command"))]
        fallbacks = role.get("fallback_workers")
        named += (
            [("fallback_workers", k) for k in fallbacks or ()]
            if isinstance(fallbacks, list)
            else []
        )
        found += [
            f"roles.{name}.{key}: " + unknown_name("worker kind", kind, kinds)
            for key, kind in named
            if isinstance(kind, str) and kind not in kinds
        ]
    return found


def reference_problems(raw: Mapping[str, Any]) -> list[str]:
    """`default_role` or `default_environment` naming none of the roles or environments the
    file declares (the built-in names `default` and `local` excepted: those stand alone)."""
    found = []
    for key, section, builtin in (
        ("default_role", "roles", "default"),
        ("default_environment", "environments", "local"),
    ):
        name, declared = raw.get(key, builtin), _mapping(raw.get(section))
        if isinstance(name, str) and declared and name != builtin and name not in declared:
            found.append(f"{key}: " + unknown_name(section.rstrip("s"), name, declared))
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _where(loc: Sequence[int | str]) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


def one_line(source: str, found: Sequence[str]) -> str:
    """The message of a configuration with problems: all of them, on one line."""
    if len(found) == 1:
        return f"{source}: {found[0]}"
    return f"{source}: {len(found)} problems: " + "; ".join(found)
