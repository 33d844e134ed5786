"""What Corral tells the outside about what happened: the committed records as events (events.py),
the brokers they are published to (sinks.py), the drainer that publishes them (drain.py); later
metrics and spans (docs/how-to/events.md)."""
