"""trace/spans.py: a job's OpenTelemetry span tree from what the store recorded (GenAI
conventions), its trace id derived from the job id, and no exporter without an endpoint."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from corral.domain.agents import AgentEvent, PolicyEvaluation, ToolCallTrace
from corral.domain.models import Attempt
from corral.domain.states import AttemptState, JobState, Outcome
from corral.trace import spans
from tests.contract.test_store_contract import NOW, make_job


def _attempt(job_id: str, index: int, **kw: object) -> Attempt:
    fields: dict[str, object] = {
        "id": f"a{index}",
        "job_id": job_id,
        "index": index,
        "state": AttemptState.SUCCEEDED,
        "permit_id": f"p{index}",
        "deadline_at": NOW + 600,
        "created_at": NOW,
        "dir": "/tmp/x",
        "engine_id": "e",
        "started_at": NOW + 1,
        "ended_at": NOW + 9,
        "exit_code": 0,
        "outcome": Outcome.EXITED,
    }
    fields.update(kw)
    return Attempt(**fields)  # type: ignore[arg-type]


def _emit(*args: object) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    spans.JobSpans(spans.provider(SimpleSpanProcessor(exporter))).emit(*args)  # type: ignore[arg-type]
    return list(exporter.get_finished_spans())


def test_an_agent_job_is_one_trace_of_attempts_and_tool_calls() -> None:
    job = make_job(
        role="coder",
        worker="claude-code",
        tenant="acme",
        state=JobState.SUCCEEDED,
        prompt="fix it",
        at=NOW - 5,
    )
    event = AgentEvent(
        event_id="e1",
        job_id=job.id,
        attempt=1,
        at=NOW + 9,
        role="coder",
        worker="claude",
        tenant="acme",
        model="claude-sonnet-4",
        session_id="s1",
        tokens_in=100,
        tokens_out=7,
        cost_usd=0.02,
        tool_calls=(
            ToolCallTrace(tool="Read", duration_ms=30, call_id="c1"),
            ToolCallTrace(
                tool="Bash", denied=True, reason="`rm` is outside this role's scope", call_id="c2"
            ),
        ),
    )
    evals = [
        PolicyEvaluation(
            at=NOW + 2,
            job_id=job.id,
            attempt=1,
            stage="tool_call",
            subject="Read",
            verdict="allow",
            reason="allowed",
            inputs={"call_id": "c1"},
        ),
        PolicyEvaluation(
            at=NOW + 3,
            job_id=job.id,
            attempt=1,
            stage="tool_call",
            subject="Bash",
            verdict="deny",
            reason="out_of_scope",
            inputs={"call_id": "c2"},
        ),
    ]
    found = {s.name: s for s in _emit(job, [_attempt(job.id, 1)], [event], evals)}
    assert set(found) == {
        "job coder",
        "invoke_agent coder",
        "execute_tool Read",
        "execute_tool Bash",
    }
    root, agent = found["job coder"], found["invoke_agent coder"]
    assert {s.context.trace_id for s in found.values()} == {spans.trace_id_of(job.id)}
    assert root.parent is None
    assert agent.parent is not None and agent.parent.span_id == root.context.span_id
    assert all(
        found[n].parent is not None and found[n].parent.span_id == agent.context.span_id
        for n in ("execute_tool Read", "execute_tool Bash")
    )
    a = agent.attributes or {}
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "coder"
    assert a["gen_ai.provider.name"] == "anthropic"
    assert a["gen_ai.request.model"] == "claude-sonnet-4"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (100, 7)
    assert (a["corral.job.id"], a["corral.attempt"], a["corral.tenant"]) == (job.id, 1, "acme")
    assert a["corral.cost_usd"] == 0.02 and a["corral.permit.id"] == "p1"
    assert agent.start_time == int((NOW + 1) * spans.NS)
    denied = found["execute_tool Bash"]
    assert (denied.attributes or {})["error.type"] == "out_of_scope"  # the code, not the text
    assert denied.status.status_code is StatusCode.ERROR
    assert denied.status.description == "`rm` is outside this role's scope"
    read = found["execute_tool Read"]
    assert "error.type" not in (read.attributes or {})
    assert read.start_time == int((NOW + 2) * spans.NS)
    assert read.end_time == read.start_time + 30_000_000


def test_a_command_job_gets_a_span_per_attempt_and_a_failure_its_error_type() -> None:
    job = make_job(role="build", worker="command", state=JobState.FAILED, at=NOW - 5)
    names = [
        (s.name, (s.attributes or {}).get("error.type"))
        for s in _emit(job, [_attempt(job.id, 1, exit_code=2, state=AttemptState.FAILED)], [], [])
    ]
    assert sorted(names, key=str) == [("execute_command build", "exited"), ("job build", None)]


def test_the_trace_id_is_derived_from_the_job_id() -> None:
    assert spans.trace_id_hex("J1") == spans.trace_id_hex("J1") != spans.trace_id_hex("J2")
    assert len(spans.trace_id_hex("J1")) == 32


def test_nothing_is_exported_without_an_endpoint() -> None:
    assert spans.from_env({}) is None
    configured = spans.from_env({spans.ENDPOINT_ENV: "http://127.0.0.1:9"})
    assert configured is not None
    configured.flush(0.1)
