"""The core protocol: JSON Lines between a scheduler and the core.

One JSON object per line, UTF-8, at most MAX_LINE bytes, nested at most
bounds.MAX_JSON_DEPTH levels (a deeper line is answered with an error, never parsed). Every
message has a `type`; requests that expect a reply carry an `id` the reply repeats.
docs/reference/core-protocol.md is the specification for other schedulers; this module is its
single implementation of the encoding.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from corral.domain import bounds
from corral.domain.bounds import BoundError
from corral.domain.errors import CorralError
from corral.domain.models import Attempt, AttemptResult, Job, JobOptions, Limits, Permit
from corral.domain.states import AttemptState, DedupMode, Fault, JobState, Outcome

MAX_LINE = 1 << 20  # 1 MiB: a job with a large prompt fits; a runaway writer does not
VERSION = 1

# Scheduler → core
REQUEST_PERMIT = "request_permit"
RELEASE = "release"
SUBMIT_JOB = "submit_job"
CANCEL_JOB = "cancel_job"
ADOPT = "adopt"
HEARTBEAT = "heartbeat"
CONTROL = "control"
REPORT_COST = "report_cost"
# Core → scheduler
HELLO = "hello"
PERMIT = "permit"
REJECTED = "rejected"
RELEASED = "released"
JOB_STARTED = "job_started"
JOB_COMPLETED = "job_completed"
ADOPTED = "adopted"
CONTROL_RESULT = "control_result"
COST_REPORTED = "cost_reported"
EVENT = "event"
ERROR = "error"

# What a line reader hands on in place of a line longer than MAX_LINE (which it skipped).
OVERSIZED = b"\x00oversized\n"



class ProtocolError(CorralError):
    """A line that is not a valid message (malformed, oversized, unknown type)."""

    code = "protocol_error"


def encode(msg: Mapping[str, Any]) -> bytes:
    line = json.dumps(msg, separators=(",", ":"), default=str).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ProtocolError(f"message of {len(line)} bytes exceeds the {MAX_LINE}-byte limit")
    return line


def decode(line: bytes | str) -> dict[str, Any]:
    """One message from one line, or ProtocolError saying what is wrong with it."""
    if len(line) > MAX_LINE or line == OVERSIZED:
        raise ProtocolError(f"line exceeds the {MAX_LINE}-byte limit; skipped")
    try:
        msg = bounds.loads_bounded(line)
    except BoundError as err:
        raise ProtocolError(f"malformed JSON: {err}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"malformed JSON: {err}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("a message must be a JSON object")
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("a message needs a string `type`")
    return msg


def field(msg: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """A required field of the expected JSON type, or ProtocolError."""
    value = msg.get(name)
    if not isinstance(value, kind):
        raise ProtocolError(f"{msg.get('type')}: field `{name}` is missing or not "
                            f"{getattr(kind, '__name__', kind)}")
    return value


# ---- domain values on the wire ------------------------------------------------------------


def job_out(j: Job) -> dict[str, Any]:
    return {
        "id": j.id, "state": j.state.value, "role": j.role, "worker": j.worker,
        "env_name": j.env_name, "priority": j.priority, "tenant": j.tenant,
        "command": list(j.command), "prompt": j.prompt, "cwd": j.cwd, "env": dict(j.env),
        "options": j.options.to_json(),
        "limits": dataclasses.asdict(j.limits),
        "key": j.key, "dedup": j.dedup.value, "workspace": j.workspace,
        "parent_id": j.parent_id, "depth": j.depth, "created_at": j.created_at,
        "updated_at": j.updated_at, "sort_at": j.sort_at, "attempts": j.attempts,
        "cancel_requested": j.cancel_requested, "stop_kind": j.stop_kind,
    }


def job_in(d: Mapping[str, Any]) -> Job:
    try:
        lim = d["limits"]
        return Job(
            id=str(d["id"]), state=JobState(d["state"]), role=str(d["role"]),
            worker=str(d["worker"]), env_name=str(d["env_name"]), priority=int(d["priority"]),
            tenant=str(d["tenant"]), command=tuple(str(a) for a in d["command"]),
            prompt=d.get("prompt"), cwd=d.get("cwd"), env=dict(d.get("env") or {}),
            options=JobOptions.from_json(d.get("options") or {}),
            limits=_limits_in(lim),
            key=d.get("key"), dedup=DedupMode(d.get("dedup", "coalesce")),
            workspace=d.get("workspace"), parent_id=d.get("parent_id"),
            depth=int(d.get("depth", 0)), created_at=float(d["created_at"]),
            updated_at=float(d["updated_at"]), sort_at=float(d["sort_at"]),
            attempts=int(d.get("attempts", 0)), cancel_requested=d.get("cancel_requested"),
            stop_kind=d.get("stop_kind"))
    except BoundError as err:
        raise ProtocolError(f"invalid job: {err}") from None
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"invalid job: {err!r}") from None


def _limits_in(d: Mapping[str, Any]) -> Limits:
    """Limits from the wire; a field the sender did not know keeps its default."""
    known = {f.name: f.type for f in dataclasses.fields(Limits)}
    values: dict[str, Any] = {}
    for name, value in d.items():
        if name in known:
            values[name] = float(value) if known[name] == "float" else value
    return bounds.check_limits(Limits(**values))


def attempt_out(a: Attempt) -> dict[str, Any]:
    return {"id": a.id, "job_id": a.job_id, "index": a.index, "state": a.state.value,
            "permit_id": a.permit_id, "deadline_at": a.deadline_at, "created_at": a.created_at,
            "dir": a.dir, "engine_id": a.engine_id, "pid": a.pid}


def attempt_in(d: Mapping[str, Any]) -> Attempt:
    try:
        return Attempt(id=str(d["id"]), job_id=str(d["job_id"]), index=int(d["index"]),
                       state=AttemptState(d["state"]), permit_id=str(d["permit_id"]),
                       deadline_at=float(d["deadline_at"]), created_at=float(d["created_at"]),
                       dir=str(d["dir"]), engine_id=str(d["engine_id"]), pid=d.get("pid"))
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"invalid attempt: {err!r}") from None


def permit_out(p: Permit) -> dict[str, Any]:
    return {"id": p.id, "job_id": p.job_id, "attempt_index": p.attempt_index,
            "issued_at": p.issued_at, "deadline_at": p.deadline_at, "grace_s": p.grace_s,
            "granted": dict(p.granted), "breaker": p.breaker, "seal": p.seal}


def permit_in(d: Mapping[str, Any]) -> Permit:
    try:
        return Permit(id=str(d["id"]), job_id=str(d["job_id"]),
                      attempt_index=int(d["attempt_index"]), issued_at=float(d["issued_at"]),
                      deadline_at=float(d["deadline_at"]), grace_s=float(d["grace_s"]),
                      granted={str(k): str(v) for k, v in dict(d["granted"]).items()},
                      breaker=str(d["breaker"]), seal=str(d["seal"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"invalid permit: {err!r}") from None


def result_out(r: AttemptResult) -> dict[str, Any]:
    return {"outcome": r.outcome.value, "exit_code": r.exit_code, "signal": r.signal,
            "error": r.error, "limit_hit": r.limit_hit, "started_at": r.started_at,
            "ended_at": r.ended_at, "cost_usd": r.cost_usd,
            "fault": r.fault.value if r.fault else None}


def result_in(d: Mapping[str, Any]) -> AttemptResult:
    try:
        return AttemptResult(outcome=Outcome(d["outcome"]), exit_code=d.get("exit_code"),
                             signal=d.get("signal"), error=d.get("error"),
                             limit_hit=d.get("limit_hit"), started_at=d.get("started_at"),
                             ended_at=d.get("ended_at"), cost_usd=d.get("cost_usd"),
                             fault=Fault(d["fault"]) if d.get("fault") else None)
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"invalid result: {err!r}") from None
