"""The code `dataclasses` generates, compiled once per installation instead of once per process.

Every frozen dataclass costs its module's import about 0.8 ms in Python 3.11: `dataclasses`
writes the source of its `__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__` and
`__delattr__` and compiles each with `exec`, at every import, in every process; the compiling is
four fifths of it. A short `corral` command creates about 150 of them: a fifth to a third of
its CPU.
Python caches a module's own bytecode in `__pycache__`; this does the same for that generated
source: `dataclasses` is given an `exec` that looks the text up in a table of code objects kept
beside the package's bytecode (`__pycache__/dataclasses.<cache tag>.bin`, marshal, as a .pyc),
compiles only what is missing, and the table is written back once, at exit, when it grew.

What runs is exactly what `exec` would have compiled from the same text (the table maps the
text's 160-bit BLAKE2b digest to its code). The table is trusted as the bytecode beside it is,
and no more: it is read only from the package's own `__pycache__`, not through a symlink, when
it is owned by this user or root and not writable by group or others; a table that cannot be
read, is damaged or was written by another Python is ignored (and replaced, where the directory
is writable). Only the `corral` command installs it (main.py), not a program that imports
Corral's client; where `dataclasses` has no `_create_fn` (another Python), nothing changes.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import hashlib
import marshal
import os
import stat
import sys
from pathlib import Path
from types import CodeType
from typing import Any

_TAG = (sys.implementation.cache_tag or "none", sys.version)
PATH = Path(__file__).with_name("__pycache__") / f"dataclasses.{_TAG[0]}.bin"
_codes: dict[bytes, bytes] = {}  # the text's BLAKE2b digest → its code, marshalled
_used: set[bytes] = set()  # the keys this process looked up
_grew = False
# What the table may hold before it starts again from one process's entries: Corral and its
# libraries make about 1,500 texts; code that changes adds its new texts beside the old ones.
MAX_ENTRIES = 20_000


def _trusted(fd: int) -> bool:
    st = os.fstat(fd)
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid in (os.geteuid(), 0)
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _read(path: Path) -> dict[bytes, bytes]:
    """The table at `path`, or an empty one when it cannot be trusted or read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        if not _trusted(fd):
            return {}
        with os.fdopen(os.dup(fd), "rb") as f:
            data: Any = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    finally:
        os.close(fd)
    if not (isinstance(data, tuple) and len(data) == 2 and data[0] == _TAG):
        return {}
    table = data[1]
    return table if isinstance(table, dict) else {}


def _write(path: Path, table: dict[bytes, bytes]) -> None:
    """Replace the table at `path` atomically (a reader sees the old one or the new one), when
    the directory is ours to write."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError:
        return  # no __pycache__, or not ours: the next process compiles again
    try:
        with os.fdopen(fd, "wb") as f:
            marshal.dump((_TAG, table), f)
        os.replace(tmp, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _code(source: str) -> CodeType:
    """The text compiled: from the table when it holds it (unmarshalled only now: a command
    uses a fraction of what the table holds), else compiled and added."""
    global _grew
    key = hashlib.blake2b(source.encode(), digest_size=20).digest()
    _used.add(key)
    found = _codes.get(key)
    if found is not None:
        with contextlib.suppress(EOFError, ValueError, TypeError):
            code = marshal.loads(found)
            if isinstance(code, CodeType):
                return code
    # as `exec` compiles a text for dataclasses.py: without this module's __future__ flags
    # (with them the generated methods' annotations would be strings)
    code = compile(source, "<string>", "exec", dont_inherit=True)
    _codes[key] = marshal.dumps(code)
    _grew = True
    return code


def _exec(source: Any, globals: Any = None, locals: Any = None) -> None:
    """`exec` for `dataclasses`: a text it has compiled before runs from the table."""
    builtins.exec(_code(source) if isinstance(source, str) else source, globals, locals)


def _save() -> None:
    if not _grew:
        return
    table = {**_read(PATH), **_codes}  # what other processes added meanwhile, too
    if len(table) > MAX_ENTRIES:  # grown with texts of older code: keep what this one used
        table = {key: _codes[key] for key in _used}
    _write(PATH, table)


def install() -> None:
    """Serve `dataclasses`' compiling from the table from now on (once per process)."""
    if getattr(dataclasses, "exec", None) is _exec or not hasattr(dataclasses, "_create_fn"):
        return
    _codes.update(_read(PATH))
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # its calls find it before the builtin
    atexit.register(_save)
