"""How jobs, attempts and timelines look: rich tables for people, plain dicts for --json."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from corral.domain.models import Attempt, Job, JobEvent
from corral.domain.states import JobState

console = Console(highlight=False)

STATE_STYLE = {
    JobState.SUCCEEDED: "green", JobState.RUNNING: "cyan", JobState.STARTING: "cyan",
    JobState.QUEUED: "white", JobState.RETRY_WAIT: "yellow", JobState.FAILED: "red",
    JobState.DEAD_LETTERED: "magenta", JobState.TIMED_OUT: "red", JobState.CANCELLED: "dim",
    JobState.KILLED: "red", JobState.DENIED: "red", JobState.AWAITING_APPROVAL: "yellow",
}


def ts(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


def short_time(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def job_json(j: Job, *, detail: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": j.id, "state": j.state.value, "role": j.role, "priority": j.priority,
        "attempts": j.attempts, "worker": j.worker, "env": j.env_name, "tenant": j.tenant,
        "command": list(j.command), "key": j.key, "created_at": ts(j.created_at),
        "updated_at": ts(j.updated_at), "exit_code": j.exit_code, "last_error": j.last_error,
        "limit_hit": j.limit_hit,
    }
    if detail:
        data.update({
            "max_attempts": j.limits.max_attempts, "timeout_s": j.limits.timeout_s,
            "grace_s": j.limits.grace_s, "dedup": j.dedup.value, "after": list(j.after),
            "cwd": j.cwd, "retry_at": ts(j.retry_at), "cancel_requested": j.cancel_requested,
            "stop_kind": j.stop_kind, "requeued_from": j.requeued_from,
            "dlq_resolution": j.dlq_resolution, "parent_id": j.parent_id, "depth": j.depth,
            "workspace": j.workspace, "deps_pending": j.deps_pending,
        })
    return data


def attempt_json(a: Attempt) -> dict[str, Any]:
    return {
        "index": a.index, "id": a.id, "state": a.state.value, "exit_code": a.exit_code,
        "signal": a.signal, "outcome": a.outcome.value if a.outcome else None,
        "started": ts(a.started_at), "ended": ts(a.ended_at), "pid": a.pid, "error": a.error,
        "limit_hit": a.limit_hit, "permit_id": a.permit_id, "deadline_at": ts(a.deadline_at),
        "log_dir": a.dir,
    }


def event_json(e: JobEvent) -> dict[str, Any]:
    return {"at": ts(e.at), "kind": e.kind, "from": e.from_state, "to": e.to_state,
            "attempt": e.attempt, "message": e.message, "data": dict(e.data)}


def styled(state: JobState) -> str:
    style = STATE_STYLE.get(state, "white")
    return f"[{style}]{state.value}[/{style}]"


def _command(j: Job, width: int = 48) -> str:
    text = " ".join(j.command) if j.command else (j.prompt or "")
    return text if len(text) <= width else text[: width - 1] + "…"


def print_jobs(jobs: Sequence[Job], *, title: str | None = None) -> None:
    if not jobs:
        console.print("no jobs" + (f" in the {title}" if title else ""))
        return
    table = Table(title=title, show_edge=False, pad_edge=False)
    for col in ("id", "state", "role", "prio", "tries", "command", "note"):
        table.add_column(col, overflow="fold" if col == "note" else "ellipsis")
    for j in jobs:
        note = j.last_error or (f"key {j.key}" if j.key else "")
        table.add_row(j.id, styled(j.state), j.role, str(j.priority),
                      f"{j.attempts}/{j.limits.max_attempts}", _command(j), note or "")
    console.print(table)


def print_job(j: Job, attempts: Sequence[Attempt], events: Sequence[JobEvent]) -> None:
    console.print(f"[bold]job {j.id}[/bold]  {styled(j.state)}")
    fields = job_json(j, detail=True)
    for name in ("role", "worker", "env", "priority", "tenant", "command", "cwd", "key", "dedup",
                 "after", "max_attempts", "timeout_s", "grace_s", "exit_code", "last_error",
                 "limit_hit", "cancel_requested", "retry_at", "requeued_from",
                 "dlq_resolution", "created_at", "updated_at"):
        value = fields.get(name)
        if value in (None, [], ""):
            continue
        console.print(f"  {name:<16} {' '.join(value) if name == 'command' else value}",
                      markup=False)
    if attempts:
        table = Table(title="attempts", show_edge=False, pad_edge=False)
        for col in ("#", "state", "exit", "signal", "started", "ended", "pid", "error"):
            table.add_column(col)
        for a in attempts:
            table.add_row(str(a.index), a.state.value, _s(a.exit_code), _s(a.signal),
                          short_time(a.started_at), short_time(a.ended_at), _s(a.pid),
                          a.error or a.limit_hit or "")
        console.print(table)
    if events:
        console.print("[bold]timeline[/bold]")
        for e in events:
            arrow = f"{e.from_state or ''}→{e.to_state}" if e.to_state else ""
            console.print(f"  {short_time(e.at)}  {e.kind:<18} {arrow:<24} {e.message}",
                          markup=False)


def _s(v: object) -> str:
    return "-" if v is None else str(v)
