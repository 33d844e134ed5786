"""Circuit breakers per worker kind, provider and model: the core's final authority.

Breakers judge the worker kinds and providers, never the jobs: a result counts as a failure only
when its worker classified it as the worker's or provider's fault (domain.states.Fault).
CLOSED → OPEN when, among the results of the last `window_s`, the failure rate reaches
`failure_rate` (once there are `min_calls`) or `consecutive_failures` failures came in a row.
OPEN → HALF_OPEN at the first permit request `open_s` after opening; HALF_OPEN admits exactly one
probe permit and refuses everything else until the probe's result closes (success) or re-opens
(failure) the breaker. An operator reset closes it. tests/unit/test_breakers.py walks each edge.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.events import BREAKER, INFO, WARNING, CoreEvent, EventSink
from corral.domain.errors import NotFound
from corral.domain.models import AttemptResult, Job
from corral.domain.settings import BreakerSpec, Settings
from corral.domain.states import Fault, Outcome

CLOSED = "CLOSED"
OPEN = "OPEN"
HALF_OPEN = "HALF_OPEN"

SUCCESS = "success"
FAILURE = "failure"
NEUTRAL = "neutral"  # cancels and kills are operator actions, not the dependency's fault


def verdict(result: AttemptResult, *, stop_requested: bool = False) -> str:
    """What one attempt result says about the health of the worker and provider that ran it.

    Only a failure the worker classified as its own (`Fault.WORKER` or `Fault.CONFIG`) is a
    failure here: a job that ran and failed on its own (a command's exit 3, a deadline, an
    agent that gave up) shows a worker that works. A signal death after we asked the attempt
    to stop is our doing, not a failure."""
    if result.outcome in (Outcome.CANCELLED, Outcome.KILLED):
        return NEUTRAL
    if stop_requested and result.outcome is Outcome.EXITED and result.signal is not None:
        return NEUTRAL
    return FAILURE if result.fault in (Fault.WORKER, Fault.CONFIG) else SUCCESS


def breaker_names(job: Job, kind: str, remote_envs: Collection[str] = ()) -> list[str]:
    """The breakers a job's attempt answers to: its worker kind, and provider/model if named.
    On a remote environment (a Ray cluster) the environment is the provider that fails, not the
    local worker kind: the attempt answers to `env:<name>` instead, so a cluster that is down
    stops that environment's work only."""
    named = (("provider", job.options.provider), ("model", job.options.model))
    first = f"env:{job.env_name}" if job.env_name in remote_envs else f"worker:{kind}"
    return [first, *(f"{key}:{value}" for key, value in named if value)]


def remote_envs(settings: Settings) -> frozenset[str]:
    """The environments whose attempts run on a cluster (a `kind: ray` environment)."""
    return frozenset(n for n, e in settings.environments.items() if e.kind == "ray")


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerState:
    """What survives a core restart: enough to keep an open breaker open."""

    name: str
    state: str
    opened_at: float | None = None
    reason: str | None = None


@dataclass(slots=True)
class Breaker:
    name: str
    spec: BreakerSpec
    state: str = CLOSED
    opened_at: float | None = None
    reason: str | None = None
    probe: str | None = None  # the permit id of the HALF_OPEN probe in flight
    calls: deque[tuple[float, bool]] = field(default_factory=deque)  # (at, failed)
    consecutive: int = 0
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=20))

    @property
    def scope(self) -> str:
        return self.name.split(":", 1)[0]

    def figures(self, now: float) -> dict[str, Any]:
        self._trim(now)
        failures = sum(1 for _, failed in self.calls if failed)
        calls = len(self.calls)
        return {
            "calls": calls,
            "failures": failures,
            "failure_rate": round(failures / calls, 4) if calls else 0.0,
            "consecutive": self.consecutive,
            "window_s": self.spec.window_s,
        }

    def _trim(self, now: float) -> None:
        while self.calls and self.calls[0][0] <= now - self.spec.window_s:
            self.calls.popleft()

    def retry_after(self, now: float) -> float | None:
        """Seconds until an OPEN breaker lets a probe through (None: not time-bound)."""
        if self.state == OPEN and self.opened_at is not None:
            return max(0.0, self.opened_at + self.spec.open_s - now)
        return None

    def trip_reason(self, now: float) -> str | None:
        """Why the figures of a CLOSED breaker say it must open, if they do."""
        f = self.figures(now)
        if self.consecutive >= self.spec.consecutive_failures:
            return "consecutive_failures"
        if f["calls"] >= self.spec.min_calls and f["failure_rate"] >= self.spec.failure_rate:
            return "failure_rate"
        return None


class BreakerBoard:
    """Every breaker of the core, created on first use; transitions become CoreEvents."""

    def __init__(self, spec: BreakerSpec, emit: EventSink, history: int = 20) -> None:
        self.spec = spec
        self.emit = emit
        self.history = history
        self.breakers: dict[str, Breaker] = {}
        # breakers kept OPEN from outside while what they guard is known to be down (a Ray
        # cluster that does not answer): no HALF_OPEN probe is spent on it (Core.note_cluster)
        self.held: set[str] = set()

    def get(self, name: str) -> Breaker:
        b = self.breakers.get(name)
        if b is None:
            b = self.breakers[name] = Breaker(
                name=name, spec=self.spec, history=deque(maxlen=self.history)
            )
        return b

    def find(self, name: str) -> Breaker:
        """An existing breaker by full name (`worker:codex`) or by bare worker kind."""
        for candidate in (name, f"worker:{name}"):
            if candidate in self.breakers:
                return self.breakers[candidate]
        raise NotFound(f"no breaker named {name!r}")

    def state(self, name: str) -> str:
        b = self.breakers.get(name)
        return b.state if b else CLOSED

    # ---- admission -----------------------------------------------------------------------

    def admits(self, name: str, now: float) -> bool:
        """True when a permit may go through this breaker now (moves OPEN → HALF_OPEN on time)."""
        b = self.get(name)
        if name in self.held and b.state != CLOSED:  # an operator's reset still lets work by
            return False
        if b.state == OPEN and b.opened_at is not None and now >= b.opened_at + self.spec.open_s:
            self._move(b, HALF_OPEN, now, "open_elapsed", {"open_s": self.spec.open_s})
        return b.state == CLOSED or (b.state == HALF_OPEN and b.probe is None)

    def begin(self, names: Iterable[str], permit_id: str) -> None:
        """The permit was issued: in a HALF_OPEN breaker it is the one probe."""
        for name in names:
            b = self.get(name)
            if b.state == HALF_OPEN and b.probe is None:
                b.probe = permit_id

    def abandon(self, names: Iterable[str], permit_id: str) -> None:
        """The permit ended without a result (never started): free the probe slot."""
        for name in names:
            b = self.breakers.get(name)
            if b is not None and b.probe == permit_id:
                b.probe = None

    # ---- results -------------------------------------------------------------------------

    def record(
        self,
        names: Iterable[str],
        permit_id: str,
        result: AttemptResult,
        now: float,
        *,
        stop_requested: bool = False,
    ) -> None:
        v = verdict(result, stop_requested=stop_requested)
        for name in names:
            self._record(self.get(name), permit_id, v, now)

    def _record(self, b: Breaker, permit_id: str, v: str, now: float) -> None:
        if b.state == HALF_OPEN and b.probe == permit_id:
            b.probe = None
            if v == SUCCESS:
                self._move(b, CLOSED, now, "probe_succeeded", {"probe": permit_id})
            elif v == FAILURE:
                self._move(b, OPEN, now, "probe_failed", {"probe": permit_id})
            return
        if b.state != CLOSED or v == NEUTRAL:
            return  # results of permits issued before the breaker opened change nothing
        b.calls.append((now, v == FAILURE))
        b.consecutive = b.consecutive + 1 if v == FAILURE else 0
        reason = b.trip_reason(now) if v == FAILURE else None
        if reason is not None:
            self._move(b, OPEN, now, reason, b.figures(now))

    def force_open(self, name: str, now: float, reason: str, data: Mapping[str, Any]) -> bool:
        """Open a breaker from outside its own figures (the watchdog's stage 3)."""
        b = self.get(name)
        if b.state == OPEN:
            return False
        self._move(b, OPEN, now, reason, data)
        return True

    def reset(self, name: str, now: float, reason: str = "operator_reset") -> Breaker:
        """Close a breaker and forget its figures (an operator's reset, or a watchdog recovery)."""
        b = self.find(name)
        self._move(b, CLOSED, now, reason, {"was": b.state})
        return b

    # ---- transitions ---------------------------------------------------------------------

    def _move(self, b: Breaker, to: str, now: float, reason: str, data: Mapping[str, Any]) -> None:
        was = b.state
        b.state, b.reason = to, reason
        if to == OPEN:
            b.opened_at = now
        if to == CLOSED:
            b.opened_at, b.probe, b.consecutive = None, None, 0
            b.calls.clear()  # a closed breaker starts from clean figures
        if to != HALF_OPEN:
            b.probe = None
        entry = {"at": now, "from": was, "to": to, "reason": reason, **dict(data)}
        b.history.append(entry)
        self.emit(
            CoreEvent(
                kind=BREAKER,
                at=now,
                scope=b.scope,
                name=b.name,
                state=to,
                severity=WARNING if to == OPEN else INFO,
                reason=reason,
                message=f"breaker {b.name}: {was} → {to} ({reason})",
                data=entry,
            )
        )

    # ---- persistence and views -----------------------------------------------------------

    def export(self) -> list[BreakerState]:
        return [
            BreakerState(name=b.name, state=b.state, opened_at=b.opened_at, reason=b.reason)
            for b in self.breakers.values()
            if b.state != CLOSED
        ]

    def restore(self, states: Iterable[BreakerState]) -> None:
        """Re-open breakers a previous core had open; a probe in flight is forgotten, so a
        HALF_OPEN breaker comes back OPEN (it half-opens again at the next request)."""
        for s in states:
            b = self.get(s.name)
            b.state = OPEN if s.state in (OPEN, HALF_OPEN) else CLOSED
            b.opened_at, b.reason, b.probe = s.opened_at, s.reason, None

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        return [
            {
                "name": b.name,
                "scope": b.scope,
                "state": b.state,
                "opened_at": b.opened_at,
                "reason": b.reason,
                "probe": b.probe,
                "retry_after_s": b.retry_after(now),
                **b.figures(now),
                "history": list(b.history),
            }
            for b in sorted(self.breakers.values(), key=lambda x: x.name)
        ]
