"""What the core's mechanism tells the outside world: one frozen event per decision worth keeping.

Every breaker transition, defense stage change, escalation and refused permit is a `CoreEvent`.
The core hands them to one callback; the engine persists them and `corral breakers` /
`corral escalations` show them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("corral.core")

# Event kinds.
BREAKER = "breaker"
DEFENSE = "defense"
ESCALATION = "escalation"
REJECTION = "rejection"
PERMIT = "permit"  # a permit's own life: one that lapsed unused at its deadline

# Severities, mildest first.
INFO = "info"
WARNING = "warning"
CRITICAL = "critical"
FATAL = "fatal"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreEvent:
    """One decision of the mechanism: what changed, about what, why (a machine code), figures."""

    kind: str  # breaker | defense | escalation | rejection | permit
    at: float
    scope: str  # worker | provider | model | watchdog | job | workerKind | workspace | global
    name: str  # the breaker, the job id, the escalation target …
    state: str  # new state: CLOSED/OPEN/HALF_OPEN, stage name, open/cleared, rejected
    severity: str
    reason: str  # machine code, snake_case (or a Rejected reason for rejections)
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (the protocol and the store carry it as is)."""
        return {
            "kind": self.kind,
            "at": self.at,
            "scope": self.scope,
            "name": self.name,
            "state": self.state,
            "severity": self.severity,
            "reason": self.reason,
            "message": self.message,
            "data": dict(self.data),
        }


EventSink = Callable[[CoreEvent], None]


class Emitter:
    """Sends events to the callback; a failing callback never breaks the mechanism."""

    def __init__(self, sink: EventSink | None) -> None:
        self.sink = sink
        self.counts: dict[str, int] = {}

    def __call__(self, event: CoreEvent) -> None:
        key = f"{event.kind}:{event.reason}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.sink is None:
            return
        try:
            self.sink(event)
        except Exception:  # observability must not take the permit gate down with it
            log.exception("core event callback failed for %s/%s", event.kind, event.reason)
