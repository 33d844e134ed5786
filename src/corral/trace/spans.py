"""OpenTelemetry spans of a finished job, with the GenAI semantic conventions.

A job is one trace whose id is derived from the job id (trace/ids.py: the first 128 bits of
sha256 of the id), so `corral show` prints it without storing anything and every engine
derives the same one. The trace has a root span `job {role}` (submit → terminal state) and one
child per attempt: `invoke_agent {role}` for an agent (kind INTERNAL, `gen_ai.*` attributes: the
agent's name is the role, its provider and model, its tokens) with one `execute_tool {tool}`
child per tool call (a denied call carries `error.type` = Corral's reason code), or
`execute_command {role}` for a command job. Every attempt span carries `corral.job.id`,
`corral.attempt`, `corral.permit.id`, `corral.tenant`, `corral.cost_usd` and `corral.limit_hit`.

The spans are built from what the store recorded once the job ended (its attempts, agent events
and policy evaluations; runtime/reporter.py calls `JobSpans.emit` after writing the run report),
so they cost nothing on the dispatch path. They are exported over OTLP/HTTP only when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (`from_env`), through a BatchSpanProcessor whose bounded
queue drops spans rather than wait: a collector that is down never blocks the engine.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context

from corral.core.ports import TOOL_CALL_STAGES
from corral.domain.agents import AgentEvent, PolicyEvaluation, ToolCallTrace
from corral.domain.models import Attempt, Job
from corral.trace.ids import OTLP_ENDPOINT_ENV as ENDPOINT_ENV
from corral.trace.ids import trace_id_hex, trace_id_of
from corral.trace.metrics import provider_of

__all__ = ["JobSpans", "from_env", "provider", "trace_id_hex", "trace_id_of"]

QUEUE_SPANS = 2048  # the export queue's bound: past it, spans are dropped, never waited for
NS = 1_000_000_000
_next_trace: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "corral_trace", default=None
)


class _JobIds(IdGenerator):
    """Random span ids; the trace id of the job whose spans are being built."""

    def __init__(self) -> None:
        self.random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        return self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        return _next_trace.get() or self.random.generate_trace_id()


def provider(processor: SpanProcessor) -> TracerProvider:
    """A tracer provider that gives each job's spans the job's trace id."""
    tp = TracerProvider(
        resource=Resource.create({"service.name": "corral"}),
        id_generator=_JobIds(),
        shutdown_on_exit=False,
    )
    tp.add_span_processor(processor)
    return tp


class JobSpans:
    """Builds and hands over the spans of finished jobs."""

    def __init__(self, tracer_provider: TracerProvider) -> None:
        self.provider = tracer_provider
        self.tracer: Tracer = tracer_provider.get_tracer("corral")

    def emit(
        self,
        job: Job,
        attempts: Sequence[Attempt],
        events: Sequence[AgentEvent],
        evaluations: Sequence[PolicyEvaluation],
    ) -> None:
        """The job's span tree (ended at once: the times are the recorded ones)."""
        token = _next_trace.set(trace_id_of(job.id))
        try:
            root = self.tracer.start_span(
                f"job {job.role}",
                kind=SpanKind.INTERNAL,
                start_time=_ns(job.created_at),
                attributes={
                    "corral.job.id": job.id,
                    "corral.tenant": job.tenant,
                    "corral.state": job.state.value,
                    "corral.worker": job.worker,
                },
            )
        finally:
            _next_trace.reset(token)
        by_attempt = {e.attempt: e for e in events}
        parent = set_span_in_context(root)
        for a in attempts:
            self._attempt(
                job,
                a,
                by_attempt.get(a.index),
                [e for e in evaluations if e.attempt == a.index],
                parent,
            )
        root.end(end_time=_ns(max(job.updated_at, job.created_at)))

    def _attempt(
        self,
        job: Job,
        a: Attempt,
        event: AgentEvent | None,
        evaluations: Sequence[PolicyEvaluation],
        parent: Context,
    ) -> None:
        start = a.started_at or a.created_at
        end = max(a.ended_at or job.updated_at, start)
        agent = event is not None or job.prompt is not None  # an agent job has a prompt
        attrs: dict[str, Any] = {
            "corral.job.id": job.id,
            "corral.attempt": a.index,
            "corral.permit.id": a.permit_id,
            "corral.tenant": job.tenant,
            "corral.worker": job.worker,
            "corral.limit_hit": a.limit_hit or (event.limit_hit if event else None) or "",
            "corral.cost_usd": float(event.cost_usd or 0.0) if event else 0.0,
        }
        if a.outcome is not None:
            attrs["corral.outcome"] = a.outcome.value
        if a.exit_code is not None:
            attrs["process.exit.code"] = a.exit_code
        if agent:
            attrs.update(_genai(job, event))
        name = f"invoke_agent {job.role}" if agent else f"execute_command {job.role}"
        span = self.tracer.start_span(
            name, context=parent, kind=SpanKind.INTERNAL, start_time=_ns(start), attributes=attrs
        )
        if a.error or (a.exit_code not in (None, 0)):
            span.set_attribute(
                "error.type", a.limit_hit or (a.outcome.value if a.outcome else "error")
            )
            span.set_status(Status(StatusCode.ERROR, a.error or None))
        child = set_span_in_context(span)
        for call, at, code in _tool_calls(event, evaluations, start):
            self._tool(job, a, call, at, code, child)
        span.end(end_time=_ns(end))

    def _tool(
        self,
        job: Job,
        a: Attempt,
        call: ToolCallTrace,
        at: float,
        code: str | None,
        parent: Context,
    ) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.tool,
            "corral.job.id": job.id,
            "corral.attempt": a.index,
        }
        if call.call_id:
            attrs["gen_ai.tool.call.id"] = call.call_id
        span = self.tracer.start_span(
            f"execute_tool {call.tool}",
            context=parent,
            kind=SpanKind.INTERNAL,
            start_time=_ns(at),
            attributes=attrs,
        )
        if code is not None:  # denied: the reason code, and the message the agent was told
            span.set_attribute("error.type", code)
            span.set_attribute("corral.reason", code)
            span.set_status(Status(StatusCode.ERROR, call.reason or code))
        span.end(end_time=_ns(at) + (call.duration_ms or 0) * 1_000_000)

    def flush(self, timeout_s: float = 2.0) -> None:
        """Hand over what is queued, waiting at most `timeout_s` (an engine that stops)."""
        self.provider.force_flush(timeout_millis=int(timeout_s * 1000))


def _genai(job: Job, event: AgentEvent | None) -> Mapping[str, Any]:
    model = event.model if event else None
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": job.role,
        "gen_ai.provider.name": provider_of(job.worker, model),
    }
    if model:
        attrs["gen_ai.request.model"] = model
    if event is not None:
        attrs["gen_ai.usage.input_tokens"] = event.tokens_in
        attrs["gen_ai.usage.output_tokens"] = event.tokens_out
        if event.session_id:
            attrs["gen_ai.conversation.id"] = event.session_id
    return attrs


def _tool_calls(
    event: AgentEvent | None, evaluations: Sequence[PolicyEvaluation], start: float
) -> list[tuple[ToolCallTrace, float, str | None]]:
    """Each tool call with when it was decided and, denied, Corral's reason code: the agent
    event's calls matched by call id to their policy evaluation (whose reason is the code; the
    event's is the message the agent got), or the evaluations alone when no event was
    recorded."""
    decided = [e for e in evaluations if e.stage in TOOL_CALL_STAGES and e.subject != "spawn"]
    by_call = {str(e.inputs.get("call_id")): e for e in decided if e.inputs.get("call_id")}
    if event is not None and event.tool_calls:
        out: list[tuple[ToolCallTrace, float, str | None]] = []
        for c in event.tool_calls:
            e = by_call.get(c.call_id or "")
            code = (e.reason if e is not None else c.reason or "denied") if c.denied else None
            out.append((c, e.at if e is not None else start, code))
        return out
    return [
        (
            ToolCallTrace(
                tool=e.subject,
                denied=e.verdict != "allow",
                reason=e.message,
                call_id=e.inputs.get("call_id"),
            ),
            e.at,
            None if e.verdict == "allow" else e.reason,
        )
        for e in decided
    ]


def _ns(seconds: float) -> int:
    return int(seconds * NS)


def from_env(environ: Mapping[str, str] | None = None) -> JobSpans | None:
    """OTLP/HTTP export when OTEL_EXPORTER_OTLP_ENDPOINT is set (the exporter reads the
    standard OTEL_EXPORTER_OTLP_* variables); None, and nothing exported, when it is not."""
    env = os.environ if environ is None else environ
    if not env.get(ENDPOINT_ENV):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    processor = BatchSpanProcessor(
        OTLPSpanExporter(timeout=5), max_queue_size=QUEUE_SPANS, export_timeout_millis=5000
    )
    return JobSpans(provider(processor))
