"""What Corral records of governed agents: tool-call traces, checkpoints, policy evaluations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["allow", "deny", "pause", "require_approval"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallTrace:
    """One tool call of an attempt, as the AgentEvent carries it."""

    tool: str
    input: Mapping[str, Any] = field(default_factory=dict)
    output: str | None = None
    duration_ms: int | None = None
    denied: bool = False
    reason: str | None = None  # why it was denied
    call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "input": dict(self.input),
            "output": self.output,
            "duration_ms": self.duration_ms,
            "denied": self.denied,
            "reason": self.reason,
            "call_id": self.call_id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCallTrace:
        return cls(
            tool=str(d["tool"]),
            input=dict(d.get("input") or {}),
            output=d.get("output"),
            duration_ms=d.get("duration_ms"),
            denied=bool(d.get("denied")),
            reason=d.get("reason"),
            call_id=d.get("call_id"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentEvent:
    """The trace of one agent attempt (an AgentEvent), written once when it ends."""

    event_id: str
    job_id: str  # the intent id of the AgentOps interface: a Job is the intent
    attempt: int
    at: float
    role: str
    worker: str
    tenant: str
    session_id: str | None = None
    cli_version: str | None = None
    model: str | None = None
    tool_calls: tuple[ToolCallTrace, ...] = ()
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    exit_code: int | None = None
    outcome: str | None = None
    limit_hit: str | None = None
    retry_count: int = 0
    checkpoint_count: int = 0
    duration_ms: int | None = None
    final_text: str | None = None
    error: str | None = None
    # The model gateway's figures (requests, upstream_calls, coalesced, refused, tokens, cost),
    # for a worker whose model calls go through it
    model_calls: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "at": self.at,
            "role": self.role,
            "worker": self.worker,
            "tenant": self.tenant,
            "session_id": self.session_id,
            "cli_version": self.cli_version,
            "model": self.model,
            "tool_calls": [t.to_dict() for t in self.tool_calls],
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": self.cost_usd,
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "limit_hit": self.limit_hit,
            "retry_count": self.retry_count,
            "checkpoint_count": self.checkpoint_count,
            "duration_ms": self.duration_ms,
            "final_text": self.final_text,
            "error": self.error,
            "model_calls": dict(self.model_calls) if self.model_calls else None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentEvent:
        return cls(
            event_id=d["event_id"],
            job_id=d["job_id"],
            attempt=int(d["attempt"]),
            at=float(d["at"]),
            role=d["role"],
            worker=d["worker"],
            tenant=d["tenant"],
            session_id=d.get("session_id"),
            cli_version=d.get("cli_version"),
            model=d.get("model"),
            tool_calls=tuple(ToolCallTrace.from_dict(t) for t in d.get("tool_calls") or ()),
            tokens_in=int(d.get("tokens_in") or 0),
            tokens_out=int(d.get("tokens_out") or 0),
            cost_usd=d.get("cost_usd"),
            exit_code=d.get("exit_code"),
            outcome=d.get("outcome"),
            limit_hit=d.get("limit_hit"),
            retry_count=int(d.get("retry_count") or 0),
            checkpoint_count=int(d.get("checkpoint_count") or 0),
            duration_ms=d.get("duration_ms"),
            final_text=d.get("final_text"),
            error=d.get("error"),
            model_calls=d.get("model_calls"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """An agent's state at a tool-call boundary: enough to resume it
    through the CLI's own session resume."""

    job_id: str
    attempt: int
    at: float
    worker: str
    session_id: str | None
    tool_call_count: int
    last_tool: str | None
    last_output_digest: str | None  # sha256 of the (redacted) last tool output
    call_id: str | None = None  # the tool call that ended here
    duration_ms: int | None = None  # how long it ran


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyEvaluation:
    """One policy check and its verdict, with a snapshot of the inputs it used (append-only)."""

    at: float
    job_id: str
    attempt: int | None
    stage: str  # "tool_call" here; the pre-run engine adds its own stages
    subject: str  # what was decided about: a tool name, …
    verdict: Verdict
    reason: str  # machine reason code: "allowed", "out_of_scope", "max_tool_calls", …
    message: str = ""  # for people (and, when denied, for the agent)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    id: int | None = None
