"""Which jobs a list returns: the query of `JobStore.list_jobs` (core/ports.py re-exports it).

Apart from the ports so that a command that only lists jobs (`corral jobs`) does not import
every port and the domain values they name."""

from __future__ import annotations

from dataclasses import dataclass

from corral.domain.states import JobState


@dataclass(frozen=True, slots=True, kw_only=True)
class JobQuery:
    """Which jobs `list_jobs` returns, newest first (None or empty: any)."""

    state: JobState | None = None
    role: str | None = None
    limit: int = 100
    dead_lettered_unresolved: bool = False
    tenant: str | None = None
    env_name: str | None = None
    before: str | None = None  # only jobs whose id sorts before this one (the next page)
    text: str | None = None  # a substring of the command (as stored, JSON) or the prompt;
    # ASCII letters match either case
    ended_since: float | None = None  # only jobs that ended (a terminal state) at or after
    # this time, the latest to end first
    parent_id: str | None = None  # only the jobs submitted from inside this one
    ref: str | None = None  # only the jobs this names: the whole id, or a prefix or suffix of
    # at least MIN_REF characters (domain/ids.py `matches`)
