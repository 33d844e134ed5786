"""The JSON shapes of epics (`corral epic … --json`, `/api/v1/epics`): an epic with its tasks'
progress and, in detail, its waves' checkpoints (services/epics.py)."""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field

from corral.domain import epics as de

from .views import IsoTime, View, iso_time


class EpicTask(View):
    """One task of an epic: its state, tries, consecutive failures and last verdict."""

    id: str
    state: de.TaskState
    attempts: int = Field(description="Tries started (each in a wave of its own).")
    failures: int = Field(description="Consecutive failed tries (3 strike the task).")
    job_id: str | None = Field(description="The current try's worker job.")
    judges: list[str] = Field(description="The current try's judge jobs.")
    commit: str | None = Field(description="Its commit on the epic branch, once passed.")
    verdict: dict[str, Any] | None = Field(
        description="The last gate: checks, council consensus, each judge's verdict, why."
    )
    updated_at: IsoTime | None

    @classmethod
    def of(cls, t: de.TaskRecord) -> Self:
        return cls(
            id=t.task_id,
            state=t.state,
            attempts=t.attempts,
            failures=t.failures,
            job_id=t.job_id,
            judges=list(t.judges),
            commit=t.commit,
            verdict=t.verdict,
            updated_at=iso_time(t.updated_at),
        )


class EpicWave(View):
    """A wave's checkpoint: the tasks it took (task → try) and what each came to."""

    wave: int
    tasks: dict[str, int]
    results: dict[str, str] | None
    head: str | None = Field(description="The epic branch's head after the wave's ratchet.")
    started_at: IsoTime | None
    ended_at: IsoTime | None

    @classmethod
    def of(cls, w: de.WaveRecord) -> Self:
        return cls(
            wave=w.wave,
            tasks=w.tasks,
            results=w.results,
            head=w.head,
            started_at=iso_time(w.started_at),
            ended_at=iso_time(w.ended_at),
        )


class Epic(View):
    """An epic: its state, the wave it is at, and its tasks."""

    id: str
    name: str
    tenant: str
    state: de.EpicState
    wave: int = Field(description="The latest wave started (0: none yet).")
    max_waves: int
    repo: str
    branch: str
    base: str = Field(description="The commit the epic branch started from.")
    cancel_requested: str | None
    reason: str | None = Field(description="Why it ended.")
    created_at: IsoTime | None
    updated_at: IsoTime | None
    tasks: list[EpicTask]

    @classmethod
    def of(cls, e: de.EpicRecord, tasks: list[de.TaskRecord]) -> Self:
        return cls(
            id=e.id,
            name=e.name,
            tenant=e.tenant,
            state=e.state,
            wave=e.wave,
            max_waves=int(e.spec.get("max_waves", 50)),
            repo=e.repo,
            branch=e.branch,
            base=e.base,
            cancel_requested=e.cancel_requested,
            reason=e.reason,
            created_at=iso_time(e.created_at),
            updated_at=iso_time(e.updated_at),
            tasks=[EpicTask.of(t) for t in tasks],
        )


class EpicShow(Epic):
    """`epic show`: the epic, its tasks and every wave's checkpoint."""

    waves: list[EpicWave]

    @classmethod
    def full(cls, e: de.EpicRecord, tasks: list[de.TaskRecord], waves: list[de.WaveRecord]) -> Self:
        return cls(**Epic.of(e, tasks).model_dump(), waves=[EpicWave.of(w) for w in waves])


class EpicPage(View):
    """`GET /api/v1/epics`: the token's tenant's epics, newest first."""

    epics: list[Epic]
