"""Spans leave the engine over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT is set, and a
collector that is down never holds the engine up (trace/spans.py). The collector here is a
loopback HTTP server that keeps what it is sent."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from corral.trace.ids import trace_id_hex
from tests.acceptance.conftest import Corral


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


def test_an_endpoint_gets_each_jobs_span_tree(corral: Corral, collector: _Collector,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT",
                       f"http://127.0.0.1:{collector.server_address[1]}")
    job = corral.submit("true")
    corral.drain()  # a draining engine flushes its spans before it exits
    spans = []
    for body in collector.bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans += [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert sorted(s.name for s in spans) == ["execute_command default", "job default"]
    assert {s.trace_id.hex() for s in spans} == {trace_id_hex(job)}


def test_a_collector_that_is_down_does_not_hold_the_engine(corral: Corral,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    jobs = [corral.submit("true") for _ in range(3)]
    started = time.monotonic()
    corral.drain()
    assert time.monotonic() - started < 20  # the export retries never hold the drain up
    assert {corral.job(j)["state"] for j in jobs} == {"SUCCEEDED"}
