"""What a restarted core needs to carry on: open breakers, active escalations, cost spent, and
the attempts it counted per job (the most recently active).

The engine persists the core's events and hands a `CoreState` (e.g. the last `Core.state()`
it saw, as JSON) to the next core's `restore`, so a crash of the core neither closes an open
breaker nor lifts an escalation nobody cleared. Gauges and the defense stage are not kept:
they are rebuilt from what the running system reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.attempts import JobAttempts
from corral.core.breakers import BreakerState
from corral.core.escalation import Escalation
from corral.domain.errors import InvalidRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreState:
    breakers: tuple[BreakerState, ...] = ()  # only those not CLOSED
    escalations: tuple[Escalation, ...] = ()  # only active ones
    costs: tuple[tuple[str, float, float], ...] = ()  # (tenant, hour start, usd)
    attempts: tuple[JobAttempts, ...] = ()  # per job: attempts started here, their cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "breakers": [
                {"name": b.name, "state": b.state, "opened_at": b.opened_at, "reason": b.reason}
                for b in self.breakers
            ],
            "escalations": [e.to_dict() for e in self.escalations],
            "costs": [list(c) for c in self.costs],
            "attempts": [
                [a.job_id, a.first_at, a.last_index, a.started, a.cost_usd] for a in self.attempts
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CoreState:
        """The inverse of `to_dict`; InvalidRequest when the document is not one."""
        try:
            breakers = tuple(
                BreakerState(
                    name=str(b["name"]),
                    state=str(b["state"]),
                    opened_at=None if b.get("opened_at") is None else float(b["opened_at"]),
                    reason=b.get("reason"),
                )
                for b in d.get("breakers", ())
            )
            escalations = tuple(Escalation.from_dict(e) for e in d.get("escalations", ()))
            costs = tuple((str(t), float(h), float(usd)) for t, h, usd in d.get("costs", ()))
            attempts = tuple(
                JobAttempts(
                    job_id=str(j),
                    first_at=float(f),
                    last_index=int(i),
                    started=int(n),
                    cost_usd=float(c),
                )
                for j, f, i, n, c in d.get("attempts", ())
            )
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidRequest(f"invalid core state: {err!r}") from None
        return cls(breakers=breakers, escalations=escalations, costs=costs, attempts=attempts)
