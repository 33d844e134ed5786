"""Path scopes: which files a role's file tools, and its shell redirections, may touch.

A scope rule for a file tool takes a path pattern: ``Read(./**)``, ``Write(src/**)``,
``Read(/data/shared/*.csv)``. A relative pattern is relative to the attempt's workspace (the
job's working directory), an absolute one names exactly that place; ``**`` matches any number of
directories, ``*`` and ``?`` a part of one name, ``[…]`` one character of a set. A bare rule
(``Read``) means the workspace: ``Read(./**)``. Nothing outside the patterns is allowed, so
``Read(/etc/**)`` and the like are denied unless a rule names them.

Every path a call touches is made absolute against the directory the call runs in, then
resolved — symlinks followed, ``..`` removed — before it is matched against patterns resolved
the same way, so a link in the workspace that points at ``/etc`` leads to ``/etc``. The
resolver is passed in (``os.path.realpath`` in the engine), which keeps the decision a function
of its inputs. `file_uses` says which paths each CLI's file tools touch (Claude Code's
Read/Write/Edit/Glob/Grep…, Codex's apply_patch, OpenCode's read/write/edit/glob/grep/list…).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "FILE_TOOLS",
    "WORKSPACE",
    "PathAccess",
    "PathPattern",
    "PathUse",
    "Place",
    "Resolve",
    "file_uses",
    "outside",
    "parse_path_pattern",
    "real",
]

PathAccess = Literal["read", "write"]
Resolve = Callable[[str], str]
"""An absolute path → the same with symlinks and ``..`` resolved (``os.path.realpath``)."""

WORKSPACE = "./**"
"""What a bare file tool rule allows: the workspace and everything under it."""

# Device files a redirection may always use: no data leaves or arrives through them
_DEVICES: Mapping[str, frozenset[str]] = {
    "/dev/null": frozenset({"read", "write"}), "/dev/zero": frozenset({"read"}),
    "/dev/stdin": frozenset({"read"}), "/dev/stdout": frozenset({"write"}),
    "/dev/stderr": frozenset({"write"}), "/dev/fd/0": frozenset({"read"}),
    "/dev/fd/1": frozenset({"write"}), "/dev/fd/2": frozenset({"write"}),
}  # fmt: skip
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True, slots=True)
class PathPattern:
    """One parsed path pattern: its literal leading directories (``base``: absolute, or relative
    to the workspace) and the glob for what lies under them."""

    source: str
    base: str
    absolute: bool
    regex: re.Pattern[str]


def parse_path_pattern(text: str) -> PathPattern:
    """Parse ``./**``, ``src/**``, ``/data/*.csv``. Raises ValueError for an unusable one."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a path pattern must not be empty")
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        raise ValueError(f"path pattern {text!r} contains a control character")
    if text.startswith("~"):
        raise ValueError(
            f"path pattern {text!r}: write the home directory out (an absolute "
            "path); `~` means a different directory to every CLI"
        )
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path pattern {text!r} must not contain `..`")
    literal: list[str] = []
    for part in parts:
        if _GLOB.search(part):
            break
        literal.append(part)
    absolute = text.startswith("/")
    base = ("/" if absolute else "") + "/".join(literal)
    return PathPattern(
        source=text,
        base=base,
        absolute=absolute,
        regex=re.compile(_glob_regex("/".join(parts[len(literal) :]))),
    )


def _glob_regex(pattern: str) -> str:
    """A glob over ``/``-separated names as a regular expression for `re.fullmatch`."""
    if not pattern:
        return ""
    segments = pattern.split("/")
    out, need_sep = [], False
    for k, seg in enumerate(segments):
        last = k == len(segments) - 1
        if seg == "**":
            if k == 0:
                out.append(".*" if last else "(?:.*/)?")
                need_sep = False
            else:
                out.append("(?:/.*)?" if last else "(?:/.*)?/")
                need_sep = False
            continue
        out.append(("/" if need_sep else "") + _segment_regex(seg))
        need_sep = True
    return "".join(out)


def _segment_regex(seg: str) -> str:
    out, i = [], 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := seg.find("]", i + 2)) != -1:
            body = seg[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class PathUse:
    """A path a call reads or writes, as the call gives it (relative to its directory)."""

    path: str
    access: PathAccess
    what: str  # where it came from, for messages: "file_path", "> redirection" …


@dataclass(frozen=True, slots=True)
class Place:
    """Where a call runs: the attempt's workspace, the call's own directory, its home."""

    workspace: str
    cwd: str
    home: str | None = None


def absolute(path: str, place: Place) -> str | None:
    """``path`` made absolute in ``place`` (not yet resolved); None for ``~user``."""
    if path == "~" or path.startswith("~/"):
        if place.home is None:
            return None
        path = place.home + path[1:]
    elif path.startswith("~"):
        return None
    return (
        posixpath.normpath(posixpath.join(place.cwd, path))
        if not path.startswith("/")
        else posixpath.normpath(path)
    )


def covers(pattern: PathPattern, resolved: str, workspace: str, resolve: Resolve) -> bool:
    """Whether ``pattern`` covers ``resolved`` (a resolved absolute path) in ``workspace``."""
    base = resolve(
        pattern.base
        if pattern.absolute
        else posixpath.join(workspace, pattern.base)
        if pattern.base
        else workspace
    )
    if resolved == base:
        rel = ""
    elif resolved.startswith(base.rstrip("/") + "/"):
        rel = resolved[len(base.rstrip("/")) + 1 :]
    else:
        return False
    return pattern.regex.fullmatch(rel) is not None


def outside(
    uses: Iterable[PathUse],
    patterns: Callable[[PathAccess], Sequence[PathPattern]],
    place: Place,
    resolve: Resolve,
) -> tuple[PathUse, str] | None:
    """The first use no pattern of its access covers, with why; None when all are covered."""
    for use in uses:
        path = absolute(use.path, place)
        if path is None:
            return use, f"cannot tell where `{use.path}` is"
        if use.access in _DEVICES.get(path, ()):
            continue
        resolved = resolve(path)
        allowed = patterns(use.access)
        if not any(covers(p, resolved, place.workspace, resolve) for p in allowed):
            shown = resolved if resolved == path else f"{path} → {resolved}"
            listed = ", ".join(p.source for p in allowed) or "nothing"
            return use, f"`{shown}` is outside this role's {use.access} scope (allowed: {listed})"
    return None


# --------------------------------------------------------------------------------------------
# What each CLI's file tools touch
# --------------------------------------------------------------------------------------------

_PATH_KEYS = ("file_path", "filePath", "notebook_path", "path")
_READERS = frozenset({"read", "notebookread", "view_image"})
_WRITERS = frozenset({"write", "edit", "multiedit", "notebookedit"})
_SEARCHERS = frozenset({"grep", "ls", "list"})
_PATCHERS = frozenset({"apply_patch", "patch"})
FILE_TOOLS = _READERS | _WRITERS | _SEARCHERS | _PATCHERS | {"glob"}
"""The tools whose scope rules take path patterns (lower-case; Claude Code's, Codex's and
OpenCode's names)."""
_PATCH_LINE = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+)$", re.M)


def file_uses(tool: str, tool_input: Mapping[str, Any]) -> tuple[list[PathUse], str | None]:
    """The paths a file tool's call touches, and a problem when they cannot be told. Raises
    KeyError for a tool that is not a file tool."""
    name = tool.lower()
    if name in _READERS or name in _WRITERS:
        key = next((k for k in _PATH_KEYS if isinstance(tool_input.get(k), str)), None)
        if key is None or not tool_input[key]:
            return [], f"{tool} call without a file path"
        return [PathUse(tool_input[key], "read" if name in _READERS else "write", key)], None
    if name in _SEARCHERS:
        path = tool_input.get("path")
        return [PathUse(path if isinstance(path, str) and path else ".", "read", "path")], None
    if name == "glob":
        return _glob_uses(tool, tool_input)
    if name in _PATCHERS:
        return _patch_uses(tool, tool_input)
    raise KeyError(tool)


def _glob_uses(tool: str, tool_input: Mapping[str, Any]) -> tuple[list[PathUse], str | None]:
    root = tool_input.get("path")
    root = root if isinstance(root, str) and root else "."
    pattern = tool_input.get("pattern")
    if not isinstance(pattern, str):
        return [], f"{tool} call without a pattern"
    parts = pattern.split("/")
    literal = []
    for part in parts:
        if _GLOB.search(part):
            break
        literal.append(part)
    if ".." in parts[len(literal) :]:
        return [], f"`{pattern}` climbs out with `..` after a wildcard; it cannot be checked"
    prefix = "/".join(literal) or "."
    if pattern.startswith("/"):
        prefix = prefix or "/"
    return [
        PathUse(
            prefix if pattern.startswith("/") else posixpath.join(root, prefix), "read", "pattern"
        )
    ], None


def _patch_uses(tool: str, tool_input: Mapping[str, Any]) -> tuple[list[PathUse], str | None]:
    text = next(
        (
            v
            for k in ("command", "patchText", "patch", "input")
            if isinstance(v := tool_input.get(k), str)
        ),
        None,
    )
    if text is None:
        return [], f"{tool} call without a patch"
    paths = [m.strip() for m in _PATCH_LINE.findall(text)]
    if not paths:
        return [], f"the {tool} patch names no file"
    return [PathUse(p, "write", "patch") for p in paths], None


def real(path: str) -> str:
    """The engine's resolver: symlinks followed, ``..`` removed (`os.path.realpath`)."""
    return os.path.realpath(path)
