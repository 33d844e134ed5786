"""Escalation: FATAL conditions and what they stop, until an operator clears them.

Conditions: a worker kind crashing `crash_loop_per_min` times in a minute (a crash is a LOST
or SPAWN_ERROR attempt, or a signal death nobody asked for); attempts of one worker kind whose
processes survived their stop ("ghosts") `ghost_max` times in `ghost_window_s` — one ghost is
that attempt's problem (its processes are stopped, a WARNING event records it), only repeated
ones say the kind's stop does not work; a workspace whose latest-wins submissions superseded
running work `superseded_max` times in `superseded_window_s` (its changes do not converge).
Actions by scope: `workerKind` isolates the kind, `workspace` locks the workspace, `global` is a
safe stop (no new permits; with `safe_stop: cancel` the running attempts are stopped too).
One escalation per (scope, target) is active at a time; only `clear` ends it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.events import ESCALATION, FATAL, INFO, WARNING, CoreEvent, EventSink
from corral.domain.errors import NotFound
from corral.domain.ids import new_id
from corral.domain.settings import EscalationSpec

WORKER_KIND = "workerKind"
WORKSPACE = "workspace"
GLOBAL = "global"
SCOPES = (WORKER_KIND, WORKSPACE, GLOBAL)
CRASH_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Escalation:
    id: str
    scope: str  # workerKind | workspace | global
    target: str  # the worker kind, the workspace, or "*"
    reason: str  # crash_loop | ghost_processes | superseded_churn | watchdog_escalate | …
    severity: str
    message: str
    opened_at: float
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "target": self.target,
            "reason": self.reason,
            "severity": self.severity,
            "message": self.message,
            "opened_at": self.opened_at,
            "data": dict(self.data),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Escalation:
        return cls(
            id=str(d["id"]),
            scope=str(d["scope"]),
            target=str(d["target"]),
            reason=str(d["reason"]),
            severity=str(d["severity"]),
            message=str(d["message"]),
            opened_at=float(d["opened_at"]),
            data=dict(d.get("data") or {}),
        )


class Escalations:
    """Active escalations and the counters of the conditions that open them."""

    def __init__(self, spec: EscalationSpec, emit: EventSink) -> None:
        self.spec = spec
        self.emit = emit
        self.active: dict[str, Escalation] = {}
        self._crashes: dict[str, deque[float]] = {}
        self._superseded: dict[str, deque[float]] = {}
        self._ghosts: dict[str, deque[float]] = {}

    # ---- conditions ----------------------------------------------------------------------

    def crash(self, kind: str, now: float, what: str) -> Escalation | None:
        """One crash of a worker kind; escalates when the kind crash-loops."""
        n = _count(self._crashes.setdefault(kind, deque()), now, CRASH_WINDOW_S)
        if n < self.spec.crash_loop_per_min:
            return None
        return self.open(
            WORKER_KIND,
            kind,
            "crash_loop",
            now,
            f"worker kind {kind} crashed {n} times in a minute (last: {what})",
            {"crashes": n, "window_s": CRASH_WINDOW_S, "last": what},
        )

    def ghosts(
        self, job_id: str, kind: str | None, pids: Iterable[int], now: float
    ) -> Escalation | None:
        """Processes of an attempt outlived its stop (they have been stopped since). Isolates
        the kind when it happens `ghost_max` times in `ghost_window_s`; before that, a WARNING
        event records it (`state` "noted")."""
        pid_list = sorted(pids)
        window = self.spec.ghost_window_s
        n = _count(self._ghosts.setdefault(kind or "*", deque()), now, window)
        data = {"job_id": job_id, "pids": pid_list, "worker": kind, "ghosts": n, "window_s": window}
        message = (
            f"job {job_id}: {len(pid_list)} process(es) survived the stop of its "
            f"attempt: {pid_list}"
        )
        if n < self.spec.ghost_max:
            self.emit(
                CoreEvent(
                    kind=ESCALATION,
                    at=now,
                    scope=WORKER_KIND if kind else GLOBAL,
                    name=kind or "*",
                    state="noted",
                    severity=WARNING,
                    reason="ghost_processes",
                    message=f"{message} (stopped; {n} of {self.spec.ghost_max} in "
                    f"{window:g}s before the kind is isolated)",
                    data=data,
                )
            )
            return None
        message = f"{message}; {n} attempts with ghosts in {window:g}s"
        if kind is None:  # whose they are is unknown: nothing narrower is safe
            return self.open(GLOBAL, "*", "ghost_processes", now, message, data)
        return self.open(WORKER_KIND, kind, "ghost_processes", now, message, data)

    def superseded(self, workspace: str, now: float) -> Escalation | None:
        window = self.spec.superseded_window_s
        n = _count(self._superseded.setdefault(workspace, deque()), now, window)
        if n < self.spec.superseded_max:
            return None
        return self.open(
            WORKSPACE,
            workspace,
            "superseded_churn",
            now,
            f"workspace {workspace}: {n} latest-wins supersessions in {window:g}s",
            {"superseded": n, "window_s": window},
        )

    # ---- lifecycle -----------------------------------------------------------------------

    def open(
        self,
        scope: str,
        target: str,
        reason: str,
        now: float,
        message: str,
        data: Mapping[str, Any],
        severity: str = FATAL,
    ) -> Escalation | None:
        """Open an escalation unless one is already active for the same scope and target."""
        if scope not in SCOPES:
            raise ValueError(f"unknown escalation scope {scope!r}")
        if self.find(scope, target) is not None:
            return None
        e = Escalation(
            id=new_id(int(now * 1000)),
            scope=scope,
            target=target,
            reason=reason,
            severity=severity,
            message=message,
            opened_at=now,
            data=dict(data),
        )
        self.active[e.id] = e
        self.emit(
            CoreEvent(
                kind=ESCALATION,
                at=now,
                scope=scope,
                name=target,
                state="open",
                severity=severity,
                reason=reason,
                message=message,
                data={"id": e.id, "action": self.action(scope), **dict(data)},
            )
        )
        return e

    def clear(self, escalation_id: str, now: float, by: str = "operator") -> Escalation:
        """An operator ends an escalation; its condition's counters start again from zero."""
        e = self.active.pop(escalation_id, None)
        if e is None:
            raise NotFound(f"no active escalation {escalation_id!r}")
        if e.scope == WORKER_KIND:
            self._crashes.pop(e.target, None)
            self._ghosts.pop(e.target, None)
        elif e.scope == GLOBAL:
            self._ghosts.pop("*", None)
        elif e.scope == WORKSPACE:
            self._superseded.pop(e.target, None)
        self.emit(
            CoreEvent(
                kind=ESCALATION,
                at=now,
                scope=e.scope,
                name=e.target,
                state="cleared",
                severity=INFO,
                reason="cleared",
                message=f"escalation {e.id} ({e.reason}) cleared by {by}",
                data={"id": e.id, "was": e.reason, "by": by, "open_s": now - e.opened_at},
            )
        )
        return e

    def action(self, scope: str) -> str:
        if scope == WORKER_KIND:
            return "isolate"
        if scope == WORKSPACE:
            return "lock"
        return f"safe_stop_{self.spec.safe_stop}"

    # ---- queries -------------------------------------------------------------------------

    def find(self, scope: str, target: str) -> Escalation | None:
        return next(
            (e for e in self.active.values() if e.scope == scope and e.target == target), None
        )

    def isolated(self, kind: str) -> Escalation | None:
        return self.find(WORKER_KIND, kind)

    def locked(self, workspace: str | None) -> Escalation | None:
        return self.find(WORKSPACE, workspace) if workspace else None

    @property
    def safe_stop(self) -> Escalation | None:
        return next((e for e in self.active.values() if e.scope == GLOBAL), None)

    def export(self) -> list[Escalation]:
        return sorted(self.active.values(), key=lambda e: e.opened_at)

    def restore(self, escalations: Iterable[Escalation]) -> None:
        for e in escalations:
            self.active[e.id] = e

    def snapshot(self) -> list[dict[str, Any]]:
        return [{**e.to_dict(), "action": self.action(e.scope)} for e in self.export()]


def _count(times: deque[float], now: float, window: float) -> int:
    """Add `now` to a sliding window of event times; how many are inside it."""
    times.append(now)
    while times and times[0] <= now - window:
        times.popleft()
    return len(times)
