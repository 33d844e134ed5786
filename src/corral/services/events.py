"""Following what the engine publishes (`corral events tail`, docs/how-to/events.md): the sink
to follow, chosen from corral.yaml's `events.sinks`, and its events as they arrive."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from corral.config import Config
from corral.domain.errors import InvalidRequest
from corral.domain.settings import SinkSpec
from corral.trace.events import Event


def sink_of(cfg: Config, name: str | None) -> SinkSpec:
    """The sink named `name`, or the only (else first) one configured."""
    sinks = cfg.settings.events.sinks
    if not sinks:
        raise InvalidRequest("no event sink is configured (events.sinks in corral.yaml)")
    if name is None:
        return sinks[0]
    for sink in sinks:
        if sink.name == name:
            return sink
    raise InvalidRequest(
        f"no event sink named {name!r} (configured: {', '.join(s.name for s in sinks)})"
    )


async def tail(sink: SinkSpec, *, from_start: bool) -> AsyncIterator[Event]:
    """The sink's events as they arrive (from the oldest it keeps with `from_start`)."""
    from corral.trace.sinks import follow  # the broker clients load only for a tail

    async for event in follow(sink, from_start=from_start):
        yield event


def line(event: Event) -> str:
    """One event as a line for an operator: subject, id, and what it is about."""
    b: dict[str, Any] = dict(event.body)
    about = b.get("job_id") or b.get("switch_id") or b.get("approval_id") or b.get("workflow")
    what = (
        b.get("message")
        or b.get("outcome")
        or b.get("verdict")
        or b.get("reason")
        or b.get("state")
        or b.get("action")
        or ""
    )
    if b.get("from_state") or b.get("to_state"):
        what = f"{b.get('from_state') or '-'} → {b.get('to_state') or '-'} {what}".strip()
    return f"{event.subject}  {event.event_id}  {about or '-'}  {what}".rstrip()
