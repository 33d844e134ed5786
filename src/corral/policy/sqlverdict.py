"""The verdict on one SQL text: what `policy.sql.check_sql` returns and `policy.sqltree` builds.

Its own module so that the two can share it without importing each other (`sql` loads
`sqltree`, and with it sqlglot, only on the first SQL text to check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SqlVerdict", "SqlVerdictKind"]

SqlVerdictKind = Literal["allow", "deny", "require_approval"]


@dataclass(frozen=True, slots=True)
class SqlVerdict:
    """The decision on one SQL text. ``statements``: the statement as written (stripped), or
    every statement re-rendered by sqlglot when there are several; empty when unparseable."""

    verdict: SqlVerdictKind
    reason: str
    message: str
    statements: tuple[str, ...] = ()
