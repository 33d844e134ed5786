"""Conversions between store rows and domain values (shared by the SQL stores)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.domain.ids import MIN_REF
from corral.domain.models import Attempt, Job, JobEvent, JobOptions, Limits
from corral.domain.states import AttemptState, DedupMode, JobState, Outcome

if TYPE_CHECKING:
    from corral.core.jobquery import JobQuery

JOB_COLUMNS = (
    "id",
    "state",
    "role",
    "worker",
    "env_name",
    "priority",
    "tenant",
    "command",
    "prompt",
    "cwd",
    "env",
    "options",
    "max_attempts",
    "timeout_s",
    "grace_s",
    "idem_key",
    "dedup",
    "workspace",
    "parent_id",
    "depth",
    "created_at",
    "updated_at",
    "sort_at",
    "retry_at",
    "attempts",
    "deps_pending",
    "after_ids",
    "last_error",
    "exit_code",
    "limit_hit",
    "cancel_requested",
    "stop_kind",
    "requeued_from",
    "dlq_resolution",
    "max_tool_calls",
    "token_budget_in",
    "token_budget_out",
)
JOB_SELECT = "SELECT " + ", ".join(JOB_COLUMNS) + " FROM jobs"
# What a job's text search compares; on SQLite the index jobs_text (migration 0028) holds exactly
# this expression after the tenant and the id, so a tenant's search never opens a job's row.
JOB_TEXT = "LOWER(command || ' ' || COALESCE(prompt, ''))"
_TERMINAL_IN = ", ".join(
    f"'{s}'"
    for s in ("SUCCEEDED", "FAILED", "DEAD_LETTERED", "TIMED_OUT", "CANCELLED", "KILLED", "DENIED")
)  # as jobs_ended's predicate spells it, so that the planner takes the index

ATTEMPT_COLUMNS = (
    "id",
    "job_id",
    "idx",
    "state",
    "permit_id",
    "permit",
    "deadline_at",
    "created_at",
    "dir",
    "engine_id",
    "pid",
    "started_at",
    "ended_at",
    "exit_code",
    "signal",
    "outcome",
    "error",
    "limit_hit",
)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """`text` with ASCII letters lowered only: what SQLite's LOWER does, so that a text search
    matches alike in every store."""
    return text.translate(_ASCII_LOWER)


def like_escape(text: str) -> str:
    """`text` as a literal inside a LIKE pattern with `ESCAPE '!'`."""
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def ref_clause(column: str, ref: str) -> tuple[str, list[Any]]:
    """The condition that `column` holds an id `ref` names (domain/ids.py): the whole id, or a
    prefix or suffix of MIN_REF or more characters; by substr, not LIKE (no wildcard to escape,
    one case rule)."""
    n = len(ref)
    if n < MIN_REF:
        return f"{column} = ?", [ref]
    whole = f"(substr({column}, 1, ?) = ? OR substr({column}, length({column}) - ? + 1) = ?)"
    return whole, [n, ref, n, ref]


def job_list_sql(query: JobQuery) -> tuple[str, tuple[object, ...]]:
    """The statement (and its parameters) of `list_jobs`: the SQL store's, and the one
    store/peek.py reads a SQLite file with."""
    clauses: list[str] = []
    params: list[object] = []
    if query.state:
        clauses.append("state = ?")
        params.append(query.state.value)
    if query.role:
        clauses.append("role = ?")
        params.append(query.role)
    if query.dead_lettered_unresolved:
        clauses.append("state = 'DEAD_LETTERED' AND dlq_resolution IS NULL")
    for column, value in (("tenant", query.tenant), ("env_name", query.env_name)):
        if value:
            clauses.append(f"{column} = ?")
            params.append(value)
    if query.before:
        clauses.append("id < ?")
        params.append(query.before)
    if query.ended_since is not None:  # the partial index jobs_ended (migration 0019)
        clauses.append(f"state IN ({_TERMINAL_IN}) AND updated_at >= ?")
        params.append(query.ended_since)
    if query.text:
        clauses.append(f"{JOB_TEXT} LIKE ? ESCAPE '!'")
        params.append("%" + like_escape(ascii_lower(query.text)) + "%")
    if query.parent_id is not None:
        clauses.append("parent_id = ?")
        params.append(query.parent_id)
    if query.ref is not None:
        named, values = ref_clause("id", query.ref)
        clauses.append(named)
        params.extend(values)
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    # the ended ones by when they ended: what their index gives without reading every job
    order = "updated_at DESC, id DESC" if query.ended_since is not None else "id DESC"
    return f"{JOB_SELECT}{where} ORDER BY {order} LIMIT ?", (*params, query.limit)


def job_params(job: Job) -> tuple[Any, ...]:
    """Column values of a job, in JOB_COLUMNS order."""
    return (
        job.id,
        job.state.value,
        job.role,
        job.worker,
        job.env_name,
        job.priority,
        job.tenant,
        dumps(list(job.command)),
        job.prompt,
        job.cwd,
        dumps(dict(job.env)),
        dumps(job.options.to_json()),
        job.limits.max_attempts,
        job.limits.timeout_s,
        job.limits.grace_s,
        job.key,
        job.dedup.value,
        job.workspace,
        job.parent_id,
        job.depth,
        job.created_at,
        job.updated_at,
        job.sort_at,
        job.retry_at,
        job.attempts,
        job.deps_pending,
        dumps(list(job.after)),
        job.last_error,
        job.exit_code,
        job.limit_hit,
        job.cancel_requested,
        job.stop_kind,
        job.requeued_from,
        job.dlq_resolution,
        job.limits.max_tool_calls,
        job.limits.token_budget_in,
        job.limits.token_budget_out,
    )


def job_from_row(r: Mapping[str, Any]) -> Job:
    return Job(
        id=r["id"],
        state=JobState(r["state"]),
        role=r["role"],
        worker=r["worker"],
        env_name=r["env_name"],
        priority=int(r["priority"]),
        tenant=r["tenant"],
        command=tuple(json.loads(r["command"])),
        prompt=r["prompt"],
        cwd=r["cwd"],
        env=json.loads(r["env"]),
        options=JobOptions.from_json(json.loads(r["options"])),
        limits=Limits(
            max_attempts=int(r["max_attempts"]),
            timeout_s=float(r["timeout_s"]),
            grace_s=float(r["grace_s"]),
            max_tool_calls=int(r["max_tool_calls"]),
            token_budget_in=int(r["token_budget_in"]),
            token_budget_out=int(r["token_budget_out"]),
        ),
        key=r["idem_key"],
        dedup=DedupMode(r["dedup"]),
        workspace=r["workspace"],
        parent_id=r["parent_id"],
        depth=int(r["depth"]),
        created_at=float(r["created_at"]),
        updated_at=float(r["updated_at"]),
        sort_at=float(r["sort_at"]),
        retry_at=r["retry_at"],
        attempts=int(r["attempts"]),
        deps_pending=int(r["deps_pending"]),
        after=tuple(json.loads(r["after_ids"])),
        last_error=r["last_error"],
        exit_code=r["exit_code"],
        limit_hit=r["limit_hit"],
        cancel_requested=r["cancel_requested"],
        stop_kind=r["stop_kind"],
        requeued_from=r["requeued_from"],
        dlq_resolution=r["dlq_resolution"],
    )


def attempt_params(a: Attempt, permit_json: str) -> tuple[Any, ...]:
    return (
        a.id,
        a.job_id,
        a.index,
        a.state.value,
        a.permit_id,
        permit_json,
        a.deadline_at,
        a.created_at,
        a.dir,
        a.engine_id,
        a.pid,
        a.started_at,
        a.ended_at,
        a.exit_code,
        a.signal,
        a.outcome.value if a.outcome else None,
        a.error,
        a.limit_hit,
    )


def attempt_from_row(r: Mapping[str, Any]) -> Attempt:
    return Attempt(
        id=r["id"],
        job_id=r["job_id"],
        index=int(r["idx"]),
        state=AttemptState(r["state"]),
        permit_id=r["permit_id"],
        deadline_at=float(r["deadline_at"]),
        created_at=float(r["created_at"]),
        dir=r["dir"],
        engine_id=r["engine_id"],
        pid=r["pid"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        exit_code=r["exit_code"],
        signal=r["signal"],
        outcome=Outcome(r["outcome"]) if r["outcome"] else None,
        error=r["error"],
        limit_hit=r["limit_hit"],
    )


def event_params(e: JobEvent) -> tuple[Any, ...]:
    return (
        e.job_id,
        e.at,
        e.kind,
        e.from_state,
        e.to_state,
        e.attempt,
        e.message,
        dumps(dict(e.data)),
    )


def event_from_row(r: Mapping[str, Any]) -> JobEvent:
    return JobEvent(
        job_id=r["job_id"],
        at=float(r["at"]),
        kind=r["kind"],
        from_state=r["from_state"],
        to_state=r["to_state"],
        attempt=r["attempt"],
        message=r["message"],
        data=json.loads(r["data"]),
    )
