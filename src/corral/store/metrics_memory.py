"""The metrics reads in memory (mixed into MemoryStore): the same aggregates as
store/metrics_sql.py, counted over the store's dictionaries."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from corral.core.ports import TOOL_CALL_STAGES, Distribution, FleetFigures, Tally
from corral.domain.agents import AgentEvent
from corral.domain.models import Attempt, Job
from corral.domain.states import AttemptState, JobState
from corral.store.retention import GONE_JOBS, GONE_TOOLS, labels, merge_usage

LIVE = (AttemptState.STARTING, AttemptState.RUNNING)


def _tallies(counter: Mapping[tuple[str, ...], int]) -> tuple[Tally, ...]:
    return tuple(Tally(k, float(v)) for k, v in sorted(counter.items()))


def _distribution(
    labels: tuple[str, ...], values: Iterable[float], bounds: Sequence[float]
) -> Distribution:
    seen = list(values)
    return Distribution(
        labels, tuple(sum(1 for v in seen if v <= b) for b in bounds), len(seen), float(sum(seen))
    )


class MemoryMetrics:
    """Mixed into MemoryStore."""

    _jobs: dict[str, Job]
    _attempts: dict[str, Attempt]
    _agent_events: dict[tuple[str, int], AgentEvent]
    _chains: dict[str, list[dict[str, Any]]]
    _gone: dict[tuple[str, str], list[float]]
    _gone_attempts: list[tuple[str, int, float | None, float | None, float]]

    async def fleet_figures(self, bounds: Sequence[float]) -> FleetFigures:
        jobs: Counter[tuple[str, ...]] = Counter(
            (j.role, j.env_name, str(j.priority), j.state.value) for j in self._jobs.values()
        )
        dlq: Counter[tuple[str, ...]] = Counter(
            (j.role,)
            for j in self._jobs.values()
            if j.state is JobState.DEAD_LETTERED and j.dlq_resolution is None
        )
        pairs = [
            (self._jobs[a.job_id], a) for a in self._attempts.values() if a.job_id in self._jobs
        ]
        inflight: Counter[tuple[str, ...]] = Counter(
            (j.role, j.env_name, j.worker) for j, a in pairs if a.state in LIVE
        )
        runs: defaultdict[str, list[float]] = defaultdict(list)
        waits: defaultdict[str, list[float]] = defaultdict(list)
        # every attempt as (role, index, started, ended, submitted): the store's and the removed
        seen = [(j.role, a.index, a.started_at, a.ended_at, j.created_at) for j, a in pairs]
        seen += self._gone_attempts
        for role, index, started, ended, submitted in seen:
            if started is not None and ended is not None:
                runs[role].append(ended - started)
            if index == 1 and started is not None:
                waits[role].append(started - submitted)
        roles = sorted({role for role, *_ in seen})
        gone: list[dict[str, Any]] = [
            {"series": series, "role": key, "n": n, "total": total}
            for (series, key), (n, total) in sorted(self._gone.items())
        ]
        tools: Counter[tuple[str, ...]] = Counter(
            (str(e["verdict"]), str(e["reason"]))
            for e in self._chains.get("policy_evaluations", ())
            if e["stage"] in TOOL_CALL_STAGES
            and not (e["stage"] == "guardrail" and e["subject"] == "spawn")
        )
        for g in gone:
            if g["series"] == GONE_TOOLS:
                tools[labels(g["role"])] += int(g["n"])
        return FleetFigures(
            jobs=_tallies(jobs),
            dlq=_tallies(dlq),
            inflight=_tallies(inflight),
            attempts=_tallies(Counter((role,) for role, *_ in seen)),
            retries=tuple(
                Tally((r,), float(sum(1 for role, i, *_ in seen if role == r and i > 1)))
                for r in roles
            ),
            attempt_seconds=tuple(_distribution((r,), runs[r], bounds) for r in roles),
            start_seconds=tuple(_distribution((r,), waits[r], bounds) for r in roles),
            tool_calls=_tallies(tools),
            usage=merge_usage(self._usage(), gone),
            removed=tuple(
                Tally(labels(g["role"]), float(g["n"])) for g in gone if g["series"] == GONE_JOBS
            ),
        )

    def _usage(self) -> tuple[tuple[tuple[str, ...], int, int, float], ...]:
        sums: dict[tuple[str, ...], tuple[int, int, float]] = {}
        for e in self._agent_events.values():
            job = self._jobs.get(e.job_id)
            if job is None:
                continue
            key = (job.role, job.tenant, job.worker)
            tin, tout, cost = sums.get(key, (0, 0, 0.0))
            sums[key] = (tin + e.tokens_in, tout + e.tokens_out, cost + (e.cost_usd or 0.0))
        return tuple((k, *v) for k, v in sorted(sums.items()))
