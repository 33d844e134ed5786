"""How jobs, attempts and timelines look: rich tables for people, and for --json the dicts of
the schema models (schemas/views.py), the JSON Schema of which is published."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.domain.agents import AgentEvent, PolicyEvaluation
from corral.domain.models import Attempt, Job, JobEvent
from corral.domain.states import JobState
from corral.schemas import plain
from corral.trace.ids import trace_id_hex

# The schema models (pydantic) are imported by the functions that dump them, and a job, its
# attempts, timeline and agent traces need them only for a value plain JSON cannot say
# (schemas/plain.py): a list, a `show`, and output for people do not build them.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from corral.schemas import views as schemas


class _Out:
    """Standard output for people: a rich Console, made (and rich imported) on first use, so
    that `--json` and commands that print nothing pay none of rich's start-up."""

    @functools.cached_property
    def _console(self) -> Console:
        from rich.console import Console

        return Console(highlight=False)

    def print(self, *objects: Any, **options: Any) -> None:
        self._console.print(*objects, **options)


console = _Out()


def new_table(**options: Any) -> Table:
    """A table in the house look: no outer edge, no padding at the edges."""
    from rich.table import Table

    return Table(**{"show_edge": False, "pad_edge": False, **options})


STATE_STYLE = {
    JobState.SUCCEEDED: "green",
    JobState.RUNNING: "cyan",
    JobState.STARTING: "cyan",
    JobState.QUEUED: "white",
    JobState.RETRY_WAIT: "yellow",
    JobState.FAILED: "red",
    JobState.DEAD_LETTERED: "magenta",
    JobState.TIMED_OUT: "red",
    JobState.CANCELLED: "dim",
    JobState.KILLED: "red",
    JobState.DENIED: "red",
    JobState.AWAITING_APPROVAL: "yellow",
}


def ts(t: float | None) -> str | None:
    """The times of --json (schemas.plain.iso_time), for the commands that print their own."""
    return plain.iso_time(t)


def short_time(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def job_json(j: Job, *, detail: bool = False) -> dict[str, Any]:
    fields = plain.job_detail(j) if detail else plain.job(j)
    return _plain_json(fields, "JobDetail" if detail else "Job")


def attempt_json(a: Attempt) -> dict[str, Any]:
    return _plain_json(plain.attempt(a), "Attempt")


def event_json(e: JobEvent) -> dict[str, Any]:
    return _plain_json(plain.job_event(e), "JobEvent")


def _plain_json(fields: dict[str, Any], view: str) -> dict[str, Any]:
    """The JSON of a view's fields (schemas/plain.py), or, for a value only its pydantic model
    can say, the model's own dump (imported then: most commands never need pydantic)."""
    try:
        return plain.json(fields)
    except plain.NotPlain:
        from corral.schemas import views as schemas

        model: type[schemas.View] = getattr(schemas, view)
        return model(**fields).dump()


def event_subject(e: dict[str, Any]) -> str:
    """What a core event is about: `worker:command` (a breaker's name says its scope already),
    `workerKind:codex`, `job:<id>`."""
    scope, name = str(e.get("scope") or ""), str(e.get("name") or "")
    return name if not scope or name.startswith(f"{scope}:") else f"{scope}:{name}"


def styled(state: JobState) -> str:
    style = STATE_STYLE.get(state, "white")
    return f"[{style}]{state.value}[/{style}]"


def _command(j: Job, width: int = 48) -> str:
    text = " ".join(j.command) if j.command else (j.prompt or "")
    return text if len(text) <= width else text[: width - 1] + "…"


def id_column(table: Table, header: str, values: Sequence[str]) -> None:
    """A column of identifiers: never cut or wrapped, whatever the terminal's width (the other
    columns give way), so that what is printed can be copied into the next command."""
    width = max((len(v) for v in values), default=len(header))
    table.add_column(header, no_wrap=True, overflow="fold", min_width=max(width, len(header)))


def print_jobs(
    jobs: Sequence[Job], *, title: str | None = None, short: Mapping[str, str] | None = None
) -> None:
    """Jobs as a table; `short`: each id's short form (Store.short_ids), the whole id without."""
    if not jobs:
        console.print("no jobs" + (f" in the {title}" if title else ""))
        return
    table = new_table(title=title)
    ids = [(short or {}).get(j.id, j.id) for j in jobs]
    id_column(table, "id", ids)
    for col in ("state", "role", "prio", "tries", "command", "note"):
        table.add_column(
            col,
            overflow="fold" if col == "note" else "ellipsis",
            no_wrap=col in ("state", "prio", "tries"),
        )
    for shown, j in zip(ids, jobs, strict=True):
        note = j.last_error or (f"key {j.key}" if j.key else "")
        table.add_row(
            shown,
            styled(j.state),
            j.role,
            str(j.priority),
            f"{j.attempts}/{j.limits.max_attempts}",
            _command(j),
            note or "",
        )
    console.print(table)


def record_json(record: Any) -> dict[str, Any]:
    """A governance record (a frozen dataclass) for `--json`: its fields, the times (`at` and
    every `*_at`) as ISO 8601 UTC (schemas/views.py `record`)."""
    from corral.schemas import views as schemas  # pydantic: on first use

    return schemas.record(record).dump()


def evaluation_json(e: PolicyEvaluation) -> dict[str, Any]:
    from corral.schemas import views as schemas  # pydantic: on first use

    return schemas.PolicyEvaluation.of(e).dump()


def agent_event_json(e: AgentEvent) -> dict[str, Any]:
    return _plain_json(plain.agent_event(e), "AgentEvent")


def print_agent_events(events: Sequence[AgentEvent], *, full: bool = False) -> None:
    """One block per agent attempt: what it used, and (full) each tool call."""
    for e in events:
        cost = f"${e.cost_usd:.4f}" if e.cost_usd is not None else "-"
        calls = len(e.tool_calls)
        denied = sum(1 for t in e.tool_calls if t.denied)
        console.print(
            f"[bold]agent attempt {e.attempt}[/bold]  {e.worker} {e.cli_version or ''}  "
            f"session {e.session_id or '-'}",
            markup=True,
            highlight=False,
        )
        console.print(
            f"  tool calls {calls} ({denied} denied)  tokens in {e.tokens_in} out "
            f"{e.tokens_out}  cost {cost}  checkpoints {e.checkpoint_count}  "
            f"limit_hit {e.limit_hit or '-'}  exit {_s(e.exit_code)}  "
            f"duration {_s(e.duration_ms)} ms",
            markup=False,
            highlight=False,
        )
        if m := e.model_calls:  # through the model gateway
            console.print(
                f"  model calls {m.get('requests', 0)} through the gateway (upstream "
                f"{m.get('upstream_calls', 0)}, coalesced {m.get('coalesced', 0)}, refused "
                f"{m.get('refused', 0)})",
                markup=False,
                highlight=False,
            )
        if e.error:  # the agent's own final error and its subtype
            console.print(f"  error: {_clip(e.error, 200)}", markup=False, highlight=False)
        if not full:
            continue
        for n, t in enumerate(e.tool_calls, 1):
            verdict = "DENIED" if t.denied else "ok"
            shown = json.dumps(dict(t.input), sort_keys=True)
            console.print(
                f"  {n:>3}. {t.tool:<10} {verdict:<6} {_s(t.duration_ms):>6} ms  "
                f"{_clip(shown, 90)}",
                markup=False,
                highlight=False,
            )
            if t.denied and t.reason:
                console.print(f"       reason: {_clip(t.reason, 120)}", markup=False)
            elif t.output:
                console.print(f"       → {_clip(t.output, 120)}", markup=False)
        if e.final_text:
            console.print(f"  final: {_clip(e.final_text, 200)}", markup=False)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_job(j: Job, attempts: Sequence[Attempt], events: Sequence[JobEvent]) -> None:
    console.print(f"[bold]job {j.id}[/bold]  {styled(j.state)}")
    fields = job_json(j, detail=True)
    for name in (
        "role",
        "worker",
        "env",
        "priority",
        "tenant",
        "command",
        "prompt",
        "cwd",
        "key",
        "dedup",
        "after",
        "max_attempts",
        "timeout_s",
        "grace_s",
        "resume_from",
        "exit_code",
        "last_error",
        "limit_hit",
        "cancel_requested",
        "retry_at",
        "requeued_from",
        "dlq_resolution",
        "created_at",
        "updated_at",
    ):
        value = fields.get(name)
        if value in (None, [], ""):
            continue
        console.print(
            f"  {name:<16} {' '.join(value) if name == 'command' else value}", markup=False
        )
    # the OpenTelemetry trace of the job: derived from its id (trace/spans.py), never stored
    console.print(f"  {'trace_id':<16} {trace_id_hex(j.id)}", markup=False)
    if attempts:
        table = new_table(title="attempts")
        for col in ("#", "state", "exit", "signal", "started", "ended", "pid", "error"):
            table.add_column(col)
        for a in attempts:
            table.add_row(
                str(a.index),
                a.state.value,
                _s(a.exit_code),
                _s(a.signal),
                short_time(a.started_at),
                short_time(a.ended_at),
                _s(a.pid),
                a.error or a.limit_hit or "",
            )
        console.print(table)
    if events:
        console.print("[bold]timeline[/bold]")
        for e in events:
            arrow = f"{e.from_state or ''}→{e.to_state}" if e.to_state else ""
            console.print(
                f"  {short_time(e.at)}  {e.kind:<18} {arrow:<24} {e.message}", markup=False
            )


def _s(v: object) -> str:
    return "-" if v is None else str(v)


def print_runs(runs: Sequence[schemas.TrainingRun]) -> None:
    """A training job's W&B runs: one block per attempt, with its final loss and model."""
    for r in runs:
        console.print(
            f"[bold]training run {r.run_id or '-'}[/bold]  attempt {_s(r.attempt)}  "
            f"{r.method or ''}  W&B {r.wandb_mode or '-'}  exit {_s(r.exit_code)}",
            markup=True,
            highlight=False,
        )
        if r.repo_id:
            console.print(
                f"  model {r.repo_id} at revision {r.revision or '-'}",
                markup=False,
                highlight=False,
            )
        if r.error:
            console.print(f"  run file: {_clip(r.error, 200)}", markup=False, highlight=False)
            continue
        if r.loss:
            first, last = r.loss[0][1], r.loss[-1][1]
            console.print(
                f"  {r.loss_metric} {first:.6g} → {last:.6g} over {len(r.loss)} steps",
                markup=False,
                highlight=False,
            )
        shown = {k: v for k, v in r.summary.items() if isinstance(v, int | float | str)}
        for key in sorted(shown)[:20]:
            console.print(f"  {key} = {shown[key]}", markup=False, highlight=False)
        if r.run_file:
            console.print(f"  run file {r.run_file}", markup=False, highlight=False)
