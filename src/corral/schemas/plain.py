"""The fields of the views a short command prints most — a job, its attempts, its timeline, its
agent traces (`show`, `jobs`, `wait`) — and their JSON, built without pydantic.

views.py's models take their fields from these very functions, so there is one mapping from a
domain value to its fields. `json` turns fields into what the model's `dump()` gives for them;
a value of a kind it does not know raises `NotPlain`, and the caller dumps through the model
instead. tests/unit/test_plain_views.py holds both to the same JSON.
"""

from __future__ import annotations

import datetime as dt
import math
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.domain import agents as da
    from corral.domain import models as dm


class NotPlain(TypeError):
    """A value whose JSON only the pydantic model can say."""


def iso_time(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC with milliseconds; None stays None."""
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


def job(j: dm.Job) -> dict[str, Any]:
    """A job in a list (`jobs`, `dlq list`, `wait`): views.Job."""
    return {
        "id": j.id,
        "state": j.state,
        "role": j.role,
        "priority": j.priority,
        "attempts": j.attempts,
        "worker": j.worker,
        "env": j.env_name,
        "tenant": j.tenant,
        "command": list(j.command),
        "key": j.key,
        "created_at": iso_time(j.created_at),
        "updated_at": iso_time(j.updated_at),
        "exit_code": j.exit_code,
        "last_error": j.last_error,
        "limit_hit": j.limit_hit,
    }


def job_detail(j: dm.Job) -> dict[str, Any]:
    """A job with its limits, dependencies, cancel fields and agent options: views.JobDetail."""
    lim = j.limits
    nb = j.options.extra.get("notebook")
    tr = j.options.extra.get("training")
    return {
        **job(j),
        "max_attempts": lim.max_attempts,
        "timeout_s": lim.timeout_s,
        "grace_s": lim.grace_s,
        "dedup": j.dedup,
        "after": list(j.after),
        "cwd": j.cwd,
        "retry_at": iso_time(j.retry_at),
        "cancel_requested": j.cancel_requested,
        "stop_kind": j.stop_kind,
        "requeued_from": j.requeued_from,
        "dlq_resolution": j.dlq_resolution,
        "parent_id": j.parent_id,
        "depth": j.depth,
        "workspace": j.workspace,
        "deps_pending": j.deps_pending,
        "prompt": j.prompt,
        "max_tool_calls": lim.max_tool_calls,
        "token_budget_in": lim.token_budget_in,
        "token_budget_out": lim.token_budget_out,
        "resume_from": j.options.resume_from,
        "notebook": nb if isinstance(nb, dict) else None,
        "training": tr if isinstance(tr, dict) else None,
        "secret_env": list(j.options.secret_env),
        "detached": j.options.detached,
    }


def attempt(a: dm.Attempt) -> dict[str, Any]:
    """One attempt of a job: views.Attempt."""
    return {
        "index": a.index,
        "id": a.id,
        "state": a.state,
        "exit_code": a.exit_code,
        "signal": a.signal,
        "outcome": a.outcome.value if a.outcome else None,
        "started": iso_time(a.started_at),
        "ended": iso_time(a.ended_at),
        "pid": a.pid,
        "error": a.error,
        "limit_hit": a.limit_hit,
        "permit_id": a.permit_id,
        "deadline_at": iso_time(a.deadline_at),
        "log_dir": a.dir,
    }


def job_event(e: dm.JobEvent) -> dict[str, Any]:
    """One line of a job's timeline: views.JobEvent (its `from` by its alias)."""
    return {
        "at": iso_time(e.at),
        "kind": e.kind,
        "from": e.from_state,
        "to": e.to_state,
        "attempt": e.attempt,
        "message": e.message,
        "data": dict(e.data),
    }


def agent_event(e: da.AgentEvent) -> dict[str, Any]:
    """The trace of one agent attempt: views.AgentEvent."""
    return {**e.to_dict(), "at": iso_time(e.at)}


# The fields of the views above whose type is `float`: pydantic gives an int there as a float.
FLOATS = frozenset({"timeout_s", "grace_s", "cost_usd"})


def json(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` as the view's `dump()` gives them: enums by value, tuples as lists, a float
    field's int as a float, an infinite or NaN number as null (pydantic's JSON mode)."""
    return {k: float(v) if k in FLOATS and type(v) is int else _value(v) for k, v in fields.items()}


def _value(v: Any) -> Any:
    if v is None or type(v) in (str, int, bool):
        return v
    if type(v) is float:
        return v if math.isfinite(v) else None
    if isinstance(v, Enum):
        return _value(v.value)
    if type(v) in (list, tuple):
        return [_value(x) for x in v]
    if type(v) is dict and all(type(k) is str for k in v):
        return {k: _value(x) for k, x in v.items()}
    raise NotPlain(type(v).__name__)
