"""The world model's reads over SQL (mixed into SqlStore): narrow rows of the live jobs and the
latest ended ones, and the running jobs' latest checkpoints and wait events, a few queries per
snapshot whatever the number of jobs (bench/world.py measures it).

The anomaly detector's baselines (migration 0021): one row per (role, job kind, metric), its
samples a JSON array rewritten in the write transaction that adds to it, so two engines adding
at once both land."""

from __future__ import annotations

import json
from collections.abc import Sequence

from corral.domain.agents import Checkpoint
from corral.domain.ids import id_floor
from corral.domain.models import AttemptSketch, Baseline, JobEvent, JobSketch
from corral.domain.states import ACTIVE, TERMINAL, JobState
from corral.store.driver import Driver, Row, indexed_by
from corral.store.rows import event_from_row

_SKETCH = (
    "SELECT id, state, role, worker, env_name, tenant, parent_id, after_ids, deps_pending,"
    " exit_code FROM jobs"
)
_WAITING = ("QUEUED", "RETRY_WAIT")
# Live states a job is neither waiting in the queue nor in flight in (those are
# world_inflight's), read one at a time: `state = ?` always goes down the (state, id) index,
# where SQLite's estimate for an IN (…) over several may scan.
_NOT_WAITING = tuple(
    s.value for s in sorted(ACTIVE) if s.value not in (*_WAITING, "STARTING", "RUNNING")
)
_ENDED_STATES = tuple(s.value for s in sorted(TERMINAL))
WAIT_KINDS = ("wait_started", "wait_ended")
CHUNK = 500  # ids per IN (…) list


_STATES = {s.value: s for s in JobState}  # a dict lookup, not an Enum call, per row


def _sketch(r: Row, workflow: str | None = None) -> JobSketch:
    after = r["after_ids"]
    return JobSketch(
        id=r["id"],
        state=_STATES[r["state"]],
        role=r["role"],
        worker=r["worker"],
        env_name=r["env_name"],
        tenant=r["tenant"],
        parent_id=r["parent_id"],
        after=tuple(json.loads(after)) if after not in (None, "[]") else (),
        deps_pending=int(r["deps_pending"]),
        exit_code=r["exit_code"],
        workflow=workflow,
    )


class SqlWorld:
    """Mixed into SqlStore."""

    driver: Driver

    @property
    def _by_state(self) -> str:
        """SQLite: go down the (state, id) index. Statistics taken while a few states hold
        every job (100,000 queued, or a long history of ended ones) say a state matches a third
        of the rows or more, and SQLite then scanned the whole table for the few jobs in flight:
        the world watch's second in 30 ms, the dispatcher's look at its running jobs in 9 ms at
        100,000 ended jobs; PostgreSQL's statistics keep each state's own share. Every read of
        the jobs in a few live states uses it (store/sql.py too)."""
        return indexed_by(self.driver, "jobs_by_state")

    async def world_jobs(self, *, finished: int) -> list[JobSketch]:
        async with self.driver.read() as tx:
            live: list[Row] = []
            for state in _NOT_WAITING:
                live += await tx.fetchall(f"{_SKETCH}{self._by_state} WHERE state = ?", (state,))
            live += await tx.fetchall(
                f"{_SKETCH} WHERE state IN (?, ?) AND (parent_id IS NOT NULL OR deps_pending > 0)",
                _WAITING,
            )
            # One ended state at a time: each reads the newest `finished` of its state down the
            # (state, id) index, where one IN (…) over them all would sort every ended job.
            ended: list[Row] = []
            for state in _ENDED_STATES:
                if finished > 0:
                    ended += await tx.fetchall(
                        f"{_SKETCH}{self._by_state} WHERE state = ? ORDER BY id DESC LIMIT ?",
                        (state, finished),
                    )
        newest = sorted(ended, key=lambda r: str(r["id"]), reverse=True)[:finished]
        return [_sketch(r) for r in (*live, *newest)]

    async def world_inflight(self) -> list[tuple[JobSketch, AttemptSketch]]:
        rows: list[Row] = []
        async with self.driver.read() as tx:
            for state in ("STARTING", "RUNNING"):  # down the (state, id) index, one each
                rows += await tx.fetchall(
                    "SELECT j.id, j.state, j.role, j.worker, j.env_name, j.tenant, j.parent_id,"
                    " j.after_ids, j.deps_pending, j.exit_code, j.options,"
                    f" a.idx, a.started_at FROM jobs j{self._by_state} JOIN attempts a"
                    " ON a.job_id = j.id AND a.idx = j.attempts WHERE j.state = ?",
                    (state,),
                )
        rows.sort(key=lambda r: str(r["id"]))
        return [
            (
                _sketch(r, json.loads(r["options"]).get("workflow")),
                AttemptSketch(index=int(r["idx"]), started_at=r["started_at"]),
            )
            for r in rows
        ]

    async def world_queues(self, *, tenant: str | None = None) -> dict[str, int]:
        # The states as literals: so SQLite counts down the partial index of waiting jobs
        # (jobs_waiting, migration 0002), which a bound parameter cannot be matched against.
        sql = "SELECT env_name, COUNT(*) AS n FROM jobs WHERE state IN ('QUEUED', 'RETRY_WAIT')"
        params: tuple[str, ...] = ()
        if tenant is not None:
            sql, params = sql + " AND tenant = ?", (tenant,)
        async with self.driver.read() as tx:
            rows = await tx.fetchall(sql + " GROUP BY env_name", params)
        return {str(r["env_name"]): int(r["n"]) for r in rows}

    async def world_sketches(self, job_ids: Sequence[str]) -> list[JobSketch]:
        found: list[Row] = []
        async with self.driver.read() as tx:
            for i in range(0, len(job_ids), CHUNK):
                ids = list(job_ids[i : i + CHUNK])
                found += await tx.fetchall(
                    f"{_SKETCH} WHERE id IN ({', '.join('?' * len(ids))})", ids
                )
        return [_sketch(r) for r in found if JobState(r["state"]) in ACTIVE]

    async def queue_reading(
        self, env: str, *, since: float
    ) -> tuple[int, list[float], list[float]]:
        async with self.driver.read() as tx:
            row = await tx.fetchone(
                "SELECT COUNT(*) AS n FROM jobs"
                " WHERE state IN ('QUEUED', 'RETRY_WAIT') AND env_name = ?",
                (env,),
            )
            # Ids sort by creation time: the window's jobs are a range of the primary key.
            arrived = await tx.fetchall(
                "SELECT created_at FROM jobs WHERE id >= ? AND env_name = ? AND created_at >= ?"
                " AND state NOT IN ('DENIED', 'AWAITING_APPROVAL', 'SUBMITTED')",
                (id_floor(since), env, since),
            )
            started = await tx.fetchall(
                "SELECT a.created_at FROM attempts a JOIN jobs j ON j.id = a.job_id"
                " WHERE a.created_at >= ? AND j.env_name = ?",
                (since, env),
            )
        return (
            int(row["n"]) if row else 0,
            [float(r["created_at"]) for r in arrived],
            [float(r["created_at"]) for r in started],
        )

    async def throttle_state(self, subject: str) -> bool:
        async with self.driver.read() as tx:
            # stage as a literal: the partial index of throttle decisions (migration 0027)
            row = await tx.fetchone(
                "SELECT reason FROM policy_evaluations WHERE stage = 'throttle' AND subject = ?"
                " AND reason IN ('throttled', 'still_throttled', 'released')"
                " ORDER BY id DESC LIMIT 1",
                (subject,),
            )
        return row is not None and row["reason"] != "released"

    async def world_records(
        self, job_ids: Sequence[str]
    ) -> tuple[dict[str, Checkpoint], list[JobEvent]]:
        latest: dict[str, Checkpoint] = {}
        events: list[tuple[int, JobEvent]] = []
        async with self.driver.read() as tx:
            for i in range(0, len(job_ids), CHUNK):
                ids = list(job_ids[i : i + CHUNK])
                marks = ", ".join("?" * len(ids))
                rows = await tx.fetchall(
                    "SELECT c.job_id, c.attempt, c.at, c.worker, c.session_id, c.tool_call_count,"
                    " c.last_tool, c.last_output_digest, c.call_id, c.duration_ms"
                    " FROM checkpoints c JOIN (SELECT job_id, MAX(id) AS id FROM checkpoints"
                    f" WHERE job_id IN ({marks}) GROUP BY job_id) m ON m.id = c.id",
                    ids,
                )
                for r in rows:
                    latest[r["job_id"]] = Checkpoint(
                        job_id=r["job_id"],
                        attempt=int(r["attempt"]),
                        at=float(r["at"]),
                        worker=r["worker"],
                        session_id=r["session_id"],
                        tool_call_count=int(r["tool_call_count"]),
                        last_tool=r["last_tool"],
                        last_output_digest=r["last_output_digest"],
                        call_id=r["call_id"],
                        duration_ms=r["duration_ms"],
                    )
                rows = await tx.fetchall(
                    "SELECT id, job_id, at, kind, from_state, to_state, attempt, message, data"
                    f" FROM job_events WHERE job_id IN ({marks}) AND kind IN (?, ?)",
                    (*ids, *WAIT_KINDS),
                )
                events.extend((int(r["id"]), event_from_row(r)) for r in rows)
        return latest, [e for _, e in sorted(events, key=lambda p: p[0])]

    async def add_baseline_samples(
        self, samples: Sequence[tuple[str, str, str, float]], *, now: float, window: int
    ) -> None:
        grouped: dict[tuple[str, str, str], list[float]] = {}
        for role, kind, metric, value in samples:
            grouped.setdefault((role, kind, metric), []).append(float(value))
        if not grouped:
            return
        async with self.driver.write() as tx:
            for (role, kind, metric), values in sorted(grouped.items()):
                row = await tx.fetchone(
                    "SELECT samples FROM world_baselines"
                    " WHERE role = ? AND kind = ? AND metric = ?",
                    (role, kind, metric),
                )
                if row is None:
                    await tx.execute(
                        "INSERT INTO world_baselines (role, kind, metric, samples, updated_at)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (role, kind, metric, json.dumps(values[-window:]), now),
                    )
                    continue
                kept = [*json.loads(row["samples"]), *values][-window:]
                await tx.execute(
                    "UPDATE world_baselines SET samples = ?, updated_at = ?"
                    " WHERE role = ? AND kind = ? AND metric = ?",
                    (json.dumps(kept), now, role, kind, metric),
                )

    async def baselines(self) -> list[Baseline]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(
                "SELECT role, kind, metric, samples, updated_at FROM world_baselines"
                " ORDER BY role, kind, metric"
            )
        return [
            Baseline(
                role=r["role"],
                kind=r["kind"],
                metric=r["metric"],
                samples=tuple(float(v) for v in json.loads(r["samples"])),
                updated_at=float(r["updated_at"]),
            )
            for r in rows
        ]
