"""A job's OpenTelemetry trace id, derived from its id: what trace/spans.py gives the job's
spans and what `corral show` prints, with no OpenTelemetry import (the CLI starts fast)."""

from __future__ import annotations

import hashlib

# Spans are exported over OTLP/HTTP only when this is set (trace/spans.py `from_env`); an engine
# imports the OpenTelemetry SDK only then.
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"


def trace_id_of(job_id: str) -> int:
    """The job's trace id: the first 128 bits of sha256(job id), never 0."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:16], "big") or 1


def trace_id_hex(job_id: str) -> str:
    """The trace id as OTLP and tracing UIs print it (32 hex digits)."""
    return f"{trace_id_of(job_id):032x}"
