"""Spans leave the engine over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT is set, and a
collector that is down never holds the engine up (trace/spans.py). The collector here is a
loopback HTTP server that keeps what it is sent."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from corral.trace.ids import trace_id_hex
from tests.acceptance.conftest import Corral
from tests.helpers import eventually


class _Collector(ThreadingHTTPServer):
    bodies: list[bytes]


class _Handler(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/traces":
            self.server.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector(("127.0.0.1", 0), _Handler)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_an_endpoint_gets_each_jobs_span_tree(
    corral: Corral, collector: _Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_address[1]}"
    )
    job = corral.submit("true")
    corral.drain()  # a draining engine flushes its spans before it exits
    spans = _spans(collector)
    assert sorted(s.name for s in spans) == ["execute_command default", "job default"]
    assert {s.trace_id.hex() for s in spans} == {trace_id_hex(job)}


def test_a_collector_that_is_down_does_not_hold_the_engine(
    corral: Corral, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    jobs = [corral.submit("true") for _ in range(3)]
    started = time.monotonic()
    corral.drain()
    assert time.monotonic() - started < 20  # the export retries never hold the drain up
    assert {corral.job(j)["state"] for j in jobs} == {"SUCCEEDED"}


def test_a_governed_agent_run_is_exported_with_its_tool_calls(
    tmp_path: Path, collector: _Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Claude Code CLI against the loopback model mock (tests/acceptance/
    test_agents.py): one invoke_agent span with an execute_tool child per call, the denied one
    carrying Corral's reason code."""
    from tests.acceptance.test_agents import CLAUDE, agent_config, bash, run_agent
    from tests.agentmock import AnthropicMock

    assert CLAUDE.exists(), "scripts/agent-clis installs the pinned CLIs"
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_address[1]}"
    )
    mock = AnthropicMock(
        [
            {"tool_calls": [bash("ls > listed.txt")]},
            {"tool_calls": [bash("ls && rm -f keep.txt")]},
            {"text": "Summary: listed; deleting was refused."},
        ]
    ).start()
    c = Corral(tmp_path, agent_config(mock.url))
    try:
        c.serve()
        job = run_agent(c)
        assert c.job(job)["state"] == "SUCCEEDED"
        eventually(
            lambda: len(_spans(collector)) >= 4,
            timeout=30,
            what="the agent job's spans at the collector",
        )
    finally:
        c.stop_all()
        mock.close()
    spans = {s.name: s for s in _spans(collector)}
    assert {s.trace_id.hex() for s in spans.values()} == {trace_id_hex(job)}
    agent = spans["invoke_agent agent"]
    attrs = {a.key: a.value for a in agent.attributes}
    assert attrs["gen_ai.agent.name"].string_value == "agent"
    assert attrs["gen_ai.provider.name"].string_value == "anthropic"
    assert attrs["gen_ai.usage.input_tokens"].int_value > 0
    assert attrs["corral.job.id"].string_value == job
    tools = [s for s in _spans(collector) if s.name == "execute_tool Bash"]
    assert len(tools) == 2 and all(t.parent_span_id == agent.span_id for t in tools)
    codes = sorted(
        next((a.value.string_value for a in t.attributes if a.key == "error.type"), "")
        for t in tools
    )
    assert codes == ["", "out_of_scope"]


def _spans(collector: _Collector) -> list[Any]:
    found = []
    for body in list(collector.bodies):
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found += [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
    return found
