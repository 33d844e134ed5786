"""The watchdog: gauges fed by the core's own calls, stall detection, staged defense.

Gauges (each also per worker kind):
- `worker_inflight_count`: live permits.
- `worker_queue_lag_ms`: at each permit request the core would serve, how long the job has
  waited: now − created_at for attempt 1, now − updated_at (when it was queued again) after.
- `worker_timeout_rate`: TIMED_OUT share of the results of the last `window_s` (0 below
  `min_samples` results).
- `worker_cancel_latency_ms`: result time − stop request (or deadline, for a timeout).
- `workspace_lock_wait_ms`: reported from outside (`Core.report_metric`).
- `stalled_attempts`: live attempts with no activity for `stall_s`.
Point gauges (lag, latency, lock wait) are the highest sample of the last `sample_s`.

Each gauge's thresholds map its value to a stage: 1 shed, 2 throttle, 3 open, 4 escalate. The
stage rises at once to the highest stage any gauge asks for, and steps down one stage per
`recover_s` spent with every gauge below the current stage. The core acts on the stage.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.events import CRITICAL, DEFENSE, INFO, WARNING, CoreEvent, EventSink
from corral.domain.settings import Thresholds, WatchdogSpec

INFLIGHT = "worker_inflight_count"
QUEUE_LAG = "worker_queue_lag_ms"
TIMEOUT_RATE = "worker_timeout_rate"
CANCEL_LATENCY = "worker_cancel_latency_ms"
LOCK_WAIT = "workspace_lock_wait_ms"
STALLED = "stalled_attempts"
GAUGES = (INFLIGHT, QUEUE_LAG, TIMEOUT_RATE, CANCEL_LATENCY, LOCK_WAIT, STALLED)
POINT_GAUGES = frozenset({QUEUE_LAG, CANCEL_LATENCY, LOCK_WAIT})

NORMAL, SHED, THROTTLE, OPEN_BREAKERS, ESCALATE = range(5)
STAGES = ("normal", "shed", "throttle", "open", "escalate")


def level_of(value: float, t: Thresholds) -> int:
    """The highest stage whose threshold the value is at or above (0: none)."""
    level = NORMAL
    for stage, threshold in (
        (SHED, t.shed),
        (THROTTLE, t.throttle),
        (OPEN_BREAKERS, t.open),
        (ESCALATE, t.escalate),
    ):
        if threshold is not None and value >= threshold:
            level = stage
    return level


def threshold_at(t: Thresholds, stage: int) -> float | None:
    return (None, t.shed, t.throttle, t.open, t.escalate)[stage]


@dataclass(slots=True)
class _Attempt:
    kind: str
    last_activity: float
    stalled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StageChange:
    before: int
    after: int
    cause: str | None


class Watchdog:
    """Gauges and the defense stage; pure state driven by the given `now`."""

    def __init__(self, spec: WatchdogSpec, emit: EventSink) -> None:
        self.spec = spec
        self.emit = emit
        self.points: dict[str, deque[tuple[float, float, str | None]]] = {
            g: deque() for g in POINT_GAUGES
        }
        self.results: deque[tuple[float, str, bool]] = deque()  # (at, kind, timed out)
        self.live: dict[str, _Attempt] = {}
        # Ray environments' clusters as the core's health probe last found them
        self.clusters: dict[str, dict[str, Any]] = {}
        self.stage = NORMAL
        self.cause: str | None = None
        self.since = 0.0
        self._below_since: float | None = None

    # ---- feeding -------------------------------------------------------------------------

    def started(self, job_id: str, kind: str, now: float) -> None:
        self.live[job_id] = _Attempt(kind=kind, last_activity=now)

    def ended(self, job_id: str) -> None:
        self.live.pop(job_id, None)

    def sample(self, gauge: str, value: float, now: float, kind: str | None = None) -> None:
        self.points[gauge].append((now, value, kind))

    def result(self, kind: str, timed_out: bool, now: float) -> None:
        self.results.append((now, kind, timed_out))

    def activity(self, job_id: str, now: float) -> None:
        a = self.live.get(job_id)
        if a is None:
            return
        a.last_activity = max(a.last_activity, now)
        if a.stalled:
            a.stalled = False
            self.emit(
                CoreEvent(
                    kind=DEFENSE,
                    at=now,
                    scope="job",
                    name=job_id,
                    state="active",
                    severity=INFO,
                    reason="stall_recovered",
                    message=f"job {job_id} is active again",
                    data={"job_id": job_id, "worker": a.kind},
                )
            )

    def cluster(self, env: str, error: str | None, now: float) -> bool:
        """What the health probe found of a Ray environment's cluster (`error` None: it
        answers). True when that changed (one event for each change)."""
        seen = self.clusters.get(env)
        reachable = error is None
        self.clusters[env] = {
            "reachable": reachable,
            "error": error,
            "checked_at": now,
            "since": seen["since"] if seen and seen["reachable"] == reachable else now,
        }
        was = True if seen is None else seen["reachable"]  # first found answering: no news
        if was == reachable:
            return False
        self.emit(
            CoreEvent(
                kind=DEFENSE,
                at=now,
                scope="cluster",
                name=env,
                state="reachable" if reachable else "unreachable",
                severity=INFO if reachable else WARNING,
                reason="cluster_reachable" if reachable else "cluster_unreachable",
                message=f"Ray cluster of environment {env} "
                + ("answers again" if reachable else f"does not answer: {error}"),
                data={"env": env, "error": error},
            )
        )
        return True

    def scan_stalls(self, now: float) -> list[str]:
        """Flag attempts silent for `stall_s`; the job ids newly stalled (one event each)."""
        found = []
        for job_id, a in self.live.items():
            idle = now - a.last_activity
            if a.stalled or idle < self.spec.stall_s:
                continue
            a.stalled = True
            found.append(job_id)
            self.emit(
                CoreEvent(
                    kind=DEFENSE,
                    at=now,
                    scope="job",
                    name=job_id,
                    state="stalled",
                    severity=WARNING,
                    reason="stall_detected",
                    message=f"job {job_id} ({a.kind}) produced nothing for {idle:.0f}s",
                    data={
                        "job_id": job_id,
                        "worker": a.kind,
                        "idle_s": idle,
                        "stall_s": self.spec.stall_s,
                    },
                )
            )
        return found

    # ---- gauges --------------------------------------------------------------------------

    def _trim(self, now: float) -> None:
        for samples in self.points.values():
            while samples and samples[0][0] <= now - self.spec.sample_s:
                samples.popleft()
        while self.results and self.results[0][0] <= now - self.spec.window_s:
            self.results.popleft()

    def values(self, now: float, kind: str | None = None) -> dict[str, float]:
        """Every gauge now, over all worker kinds or one."""
        self._trim(now)
        mine = [a for a in self.live.values() if kind is None or a.kind == kind]
        out = {INFLIGHT: float(len(mine)), STALLED: float(sum(a.stalled for a in mine))}
        for g, samples in self.points.items():
            vals = [v for _, v, k in samples if kind is None or k == kind]
            out[g] = max(vals, default=0.0)
        res = [t for _, k, t in self.results if kind is None or k == kind]
        enough = len(res) >= self.spec.min_samples
        out[TIMEOUT_RATE] = round(sum(res) / len(res), 4) if enough and res else 0.0
        return {g: out[g] for g in GAUGES}

    def kinds(self) -> set[str]:
        seen = {a.kind for a in self.live.values()} | {k for _, k, _ in self.results}
        return seen | {k for s in self.points.values() for _, _, k in s if k is not None}

    def involved(self, now: float, stage: int) -> list[str]:
        """Worker kinds behind the gauges at `stage`: those over the threshold on their own,
        else every kind contributing to an over-threshold gauge."""
        totals = self.values(now)
        per_kind = {k: self.values(now, k) for k in sorted(self.kinds())}
        found: list[str] = []
        for gauge, t in self.spec.gauges.items():
            threshold = threshold_at(t, stage)
            if threshold is None or totals.get(gauge, 0.0) < threshold:
                continue
            over = [k for k, v in per_kind.items() if v[gauge] >= threshold]
            over = over or [k for k, v in per_kind.items() if v[gauge] > 0]
            found.extend(k for k in over if k not in found)
        return found

    # ---- stage ---------------------------------------------------------------------------

    def desired(self, values: Mapping[str, float]) -> tuple[int, str | None]:
        """The stage the gauges ask for, and the gauge asking for the most."""
        best, cause = NORMAL, None
        for gauge in GAUGES:
            t = self.spec.gauges.get(gauge)
            level = level_of(values[gauge], t) if t else NORMAL
            if level > best:
                best, cause = level, gauge
        return best, cause

    def evaluate(self, now: float) -> StageChange | None:
        """Rise at once; step down one stage after `recover_s` below the current stage."""
        values = self.values(now)
        want, cause = self.desired(values)
        if want > self.stage:
            return self._move(want, cause, now, values, "threshold_exceeded")
        if want == self.stage:
            self._below_since = None
            self.cause = cause or self.cause
            return None
        if self._below_since is None:
            self._below_since = now
            return None
        if now - self._below_since < self.spec.recover_s:
            return None
        return self._move(
            self.stage - 1, cause if want > NORMAL else self.cause, now, values, "recovered"
        )

    def _move(
        self, to: int, cause: str | None, now: float, values: Mapping[str, float], reason: str
    ) -> StageChange:
        before = self.stage
        self.stage, self.cause, self.since = to, cause, now
        self._below_since = now if reason == "recovered" else None
        if to == NORMAL:
            self.cause = None
        t = self.spec.gauges.get(cause) if cause else None
        data: dict[str, Any] = {
            "from": STAGES[before],
            "to": STAGES[to],
            "gauge": cause,
            "value": values.get(cause) if cause else None,
            "threshold": threshold_at(t, to) if t and to else None,
            "gauges": dict(values),
        }
        severity = CRITICAL if to == ESCALATE else WARNING if to > before else INFO
        self.emit(
            CoreEvent(
                kind=DEFENSE,
                at=now,
                scope="watchdog",
                name="watchdog",
                state=STAGES[to],
                severity=severity,
                reason=reason,
                message=f"defense stage {STAGES[before]} → {STAGES[to]}"
                + (f" ({cause}={values.get(cause)})" if cause else ""),
                data=data,
            )
        )
        return StageChange(before=before, after=to, cause=cause)

    @property
    def stall_driven(self) -> bool:
        return self.cause == STALLED

    def stalled_jobs(self) -> list[str]:
        return sorted(j for j, a in self.live.items() if a.stalled)

    def snapshot(self, now: float, kinds: Iterable[str] = ()) -> dict[str, Any]:
        names = sorted(set(kinds) | self.kinds())
        return {
            "stage": self.stage,
            "stage_name": STAGES[self.stage],
            "cause": self.cause,
            "since": self.since,
            "gauges": self.values(now),
            "by_worker": {k: self.values(now, k) for k in names},
            "stalled": self.stalled_jobs(),
            "clusters": {env: dict(c) for env, c in sorted(self.clusters.items())},
            "thresholds": {
                g: {"shed": t.shed, "throttle": t.throttle, "open": t.open, "escalate": t.escalate}
                for g, t in sorted(self.spec.gauges.items())
            },
        }
