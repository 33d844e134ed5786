"""What Corral tells the outside: the committed records as events (events.py), the brokers they
are published to (sinks.py) and the drainer that publishes them (drain.py); metrics read at
scrape time (metrics.py) and OpenTelemetry spans per job (spans.py). See docs/how-to/events.md
and docs/how-to/observability.md."""
