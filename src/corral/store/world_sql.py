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
from corral.domain.models import Baseline, JobEvent, JobSketch
from corral.domain.states import ACTIVE, TERMINAL, JobState
from corral.store.driver import Driver, Row
from corral.store.rows import event_from_row

_SKETCH = (
    "SELECT id, state, role, worker, env_name, tenant, parent_id, after_ids, deps_pending,"
    " exit_code FROM jobs"
)
_ACTIVE = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE))
_ENDED_STATES = tuple(s.value for s in sorted(TERMINAL))
WAIT_KINDS = ("wait_started", "wait_ended")
CHUNK = 500  # ids per IN (…) list


def _sketch(r: Row) -> JobSketch:
    return JobSketch(
        id=r["id"],
        state=JobState(r["state"]),
        role=r["role"],
        worker=r["worker"],
        env_name=r["env_name"],
        tenant=r["tenant"],
        parent_id=r["parent_id"],
        after=tuple(json.loads(r["after_ids"])) if r["after_ids"] not in (None, "[]") else (),
        deps_pending=int(r["deps_pending"]),
        exit_code=r["exit_code"],
    )


class SqlWorld:
    """Mixed into SqlStore."""

    driver: Driver

    async def world_jobs(self, *, finished: int) -> list[JobSketch]:
        async with self.driver.read() as tx:
            live = await tx.fetchall(f"{_SKETCH} WHERE state IN ({_ACTIVE})")
            # One ended state at a time: each reads the newest `finished` of its state down the
            # (state, id) index, where one IN (…) over them all would sort every ended job.
            ended: list[Row] = []
            for state in _ENDED_STATES:
                if finished > 0:
                    ended += await tx.fetchall(
                        f"{_SKETCH} WHERE state = ? ORDER BY id DESC LIMIT ?", (state, finished)
                    )
        newest = sorted(ended, key=lambda r: str(r["id"]), reverse=True)[:finished]
        return [_sketch(r) for r in (*live, *newest)]

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
