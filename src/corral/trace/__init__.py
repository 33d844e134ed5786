"""Observability out: metrics read at scrape time, OpenTelemetry spans per attempt, event sinks."""
