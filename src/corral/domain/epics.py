"""Epics run as waves of fresh agents (docs/how-to/epics.md): the values the store keeps.

An epic is a set of tasks with dependencies; each wave ignites one fresh agent job per
unblocked task, reaps it (checks, then the council) and ratchets what passed onto the epic's
branch. The pure rules live in corral.waves; these are the records they decide over."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class EpicState(StrEnum):
    RUNNING = "running"
    DONE = "done"  # every task passed
    PARTIAL = "partial"  # nothing left to run, some tasks struck or blocked
    WAVE_LIMIT = "wave_limit"  # max_waves reached with work left
    CANCELLED = "cancelled"
    FAILED = "failed"  # the epic could not run (its repository went away …)

    @property
    def terminal(self) -> bool:
        return self is not EpicState.RUNNING


class TaskState(StrEnum):
    OPEN = "open"  # waiting for its dependencies or the next wave
    RUNNING = "running"  # a wave holds it (its worker or judges run)
    PASSED = "passed"  # ratcheted: committed on the epic branch, never reopens
    STRUCK = "struck"  # skipped after its failures (strike rule or retry bound)
    ESCALATED = "escalated"  # a human or a re-decomposition decides (its verdict says which)
    DECOMPOSED = "decomposed"  # replaced by the smaller tasks a re-decomposition proposed
    BLOCKED = "blocked"  # a dependency was struck, escalated or cancelled: it can never run
    CANCELLED = "cancelled"

    @property
    def settled(self) -> bool:
        return self not in (TaskState.OPEN, TaskState.RUNNING)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpicRecord:
    """An epic as the store holds it; `spec` is the parsed epic file as JSON-able data."""

    id: str
    name: str
    tenant: str
    repo: str
    base: str  # the commit the epic branch started from
    branch: str
    spec: dict[str, Any]
    state: EpicState
    wave: int  # the latest wave started (0: none yet)
    created_at: float
    updated_at: float
    cancel_requested: str | None = None
    reason: str | None = None  # why it ended, for people

    def with_(self, **changes: Any) -> EpicRecord:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRecord:
    """One task's progress. `attempts`: tries started; `failures`: consecutive failed ones;
    `job_id`: the current try's worker job (set once submitted, so a resumed wave never
    submits it again); `verdict`: the last gate's outcome with its council for people."""

    epic_id: str
    task_id: str
    position: int
    state: TaskState
    attempts: int = 0
    failures: int = 0
    job_id: str | None = None
    judges: tuple[str, ...] = ()  # the current try's judge jobs
    commit: str | None = None  # the epic branch commit holding this task's work
    verdict: dict[str, Any] | None = None
    updated_at: float = 0.0

    def with_(self, **changes: Any) -> TaskRecord:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class WaveRecord:
    """A wave's checkpoint: which tasks it ran (task id → attempt) and, once reaped, what each
    came to and the epic branch's head after the ratchet."""

    epic_id: str
    wave: int
    started_at: float
    tasks: dict[str, int]
    ended_at: float | None = None
    results: dict[str, str] | None = None
    head: str | None = None
