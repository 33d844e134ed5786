"""The verdict on one SQL text (policy/sql.py decides it, policy/sqltree.py parses for it): its
own module so that the parser side, loaded lazily, does not import back the module that loads
it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SqlVerdictKind = Literal["allow", "deny", "require_approval"]


@dataclass(frozen=True, slots=True)
class SqlVerdict:
    """The decision on one SQL text. ``statements``: the statement as written (stripped), or
    every statement re-rendered by sqlglot when there are several; empty when unparseable."""

    verdict: SqlVerdictKind
    reason: str
    message: str
    statements: tuple[str, ...] = ()
