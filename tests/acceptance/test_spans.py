"""A real engine run's OpenTelemetry spans (trace/spans.py): the engine, in this process,
drains a command job; its reporter hands the job's span tree to an in-memory exporter."""

from __future__ import annotations

import anyio
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.config import load
from corral.runtime.engine import Engine
from corral.trace import spans
from tests.acceptance.conftest import Corral


def test_a_command_job_run_by_the_engine_is_one_trace(corral: Corral) -> None:
    ok = corral.submit("sh", "-c", "exit 0")
    failed = corral.submit("sh", "-c", "exit 2", opts=("--max-attempts", "1"))
    engine = Engine(load(data_dir=corral.data, config_path=corral.config))
    assert engine.spans is None  # no OTEL_EXPORTER_OTLP_ENDPOINT here: nothing is exported
    exporter = InMemorySpanExporter()
    engine.reporter.spans = spans.JobSpans(spans.provider(SimpleSpanProcessor(exporter)))
    anyio.run(lambda: engine.run(drain=True))

    by_trace: dict[int, dict[str, object]] = {}
    for s in exporter.get_finished_spans():
        by_trace.setdefault(s.context.trace_id, {})[s.name] = s
    assert set(by_trace) == {spans.trace_id_of(ok), spans.trace_id_of(failed)}
    for job_id, error in ((ok, None), (failed, "exited")):
        tree = by_trace[spans.trace_id_of(job_id)]
        assert set(tree) == {"job default", "execute_command default"}
        root, attempt = tree["job default"], tree["execute_command default"]
        assert attempt.parent.span_id == root.context.span_id  # type: ignore[attr-defined]
        attrs = attempt.attributes  # type: ignore[attr-defined]
        assert (attrs["corral.job.id"], attrs["corral.attempt"]) == (job_id, 1)
        assert attrs.get("error.type") == error
    assert spans.trace_id_hex(ok) in corral.ok("show", ok)
    assert corral.json("show", failed)["trace_id"] == spans.trace_id_hex(failed)
