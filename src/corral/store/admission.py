"""Queue bounds and workspace locks in SQL, run inside SqlStore's transactions.

Backpressure: a submission reads how many jobs wait to run (QUEUED or RETRY_WAIT) in its
environment and overall, then inserts, in one transaction. On SQLite the numbers are kept per
environment by triggers on `jobs` (`queue_depth`, migration 0032), so the check costs the same
at any depth; its write transactions are serialised (BEGIN IMMEDIATE), so the bound is exact.
PostgreSQL counts the waiting jobs, up to the bound (a row every submission and claim updated
would serialise the engines on its lock), and runs submissions concurrently at READ COMMITTED,
where two of them may both count one below the bound and both insert; within `PG_NEAR_BOUND`
of a bound every submission therefore takes one advisory lock and counts again. The bound is
then exact unless more than `PG_NEAR_BOUND` other submissions commit while one is in flight,
and never overshot by more than the submit transactions open at once (each engine's pool
holds at most 4 connections; each `corral submit` one).

Workspace locks: `workspace_locks` holds, per workspace, the one job
that may run on it. `reject`/`coalesce` jobs take it at submission, `serialize` jobs in
`start_attempts` together with QUEUED → STARTING (a claim whose workspace another job holds
loses). It is held through RETRY_WAIT and released on every terminal path (`SqlStore._end` and
the dependency-failure cascade). `workspace_waits` measures how long jobs waited for it.
"""

from __future__ import annotations

from corral.core.ports import Admission
from corral.domain.errors import StaleState
from corral.domain.models import Job, JobEvent
from corral.domain.states import ACTIVE, TERMINAL
from corral.scheduler.service import queue_full
from corral.store.driver import Tx
from corral.store.rows import JOB_COLUMNS, job_from_row
from corral.store.rules import acquired_event


def _states(states: frozenset[str]) -> str:
    return "(" + ", ".join(f"'{s}'" for s in sorted(states)) + ")"


ACTIVE_SQL = _states(frozenset(s.value for s in ACTIVE))
TERMINAL_SQL = _states(frozenset(s.value for s in TERMINAL))
WAITING_SQL = "('QUEUED', 'RETRY_WAIT')"  # what a queue bound counts
PG_NEAR_BOUND = 32
_QUEUE_LOCK = 7263540002  # pg advisory lock key (7263540001 serialises migrations)

# A queued job may start when it has no workspace, or no other active job holds its workspace
# and either it holds the lock itself (a retry; taken at submission) or no runnable job on the
# workspace comes earlier in queue order. Candidates are the rows of `jobs` (unaliased); each
# subquery is a point lookup (workspace_locks' primary key, jobs' primary key, jobs_by_workspace),
# and a job blocked behind a holder costs one of them.
RUNNABLE_ON_WORKSPACE = (
    "(jobs.workspace IS NULL OR ("
    "NOT EXISTS (SELECT 1 FROM workspace_locks w JOIN jobs h ON h.id = w.job_id"
    " WHERE w.workspace = jobs.workspace AND w.job_id <> jobs.id"
    f" AND h.state NOT IN {TERMINAL_SQL})"
    " AND (EXISTS (SELECT 1 FROM workspace_locks w"
    " WHERE w.workspace = jobs.workspace AND w.job_id = jobs.id)"
    " OR NOT EXISTS (SELECT 1 FROM jobs o WHERE o.workspace = jobs.workspace"
    " AND o.state = 'QUEUED' AND o.deps_pending = 0"
    " AND (o.sort_at < jobs.sort_at OR (o.sort_at = jobs.sort_at AND o.id < jobs.id))))))"
)
# Latest-wins (scheduler/dedup.py): the job a submission superseded keeps its attempt until its
# whole process tree is gone, so a queued job waits while another job with its idempotency key
# still has an attempt in flight: the old and the new never run side by side. The subquery walks
# the live attempts (attempts_live), as many as run at once.
RUNNABLE_ON_KEY = (
    "(jobs.idem_key IS NULL OR NOT EXISTS (SELECT 1 FROM attempts a JOIN jobs o"
    " ON o.id = a.job_id WHERE a.state IN ('STARTING', 'RUNNING')"
    " AND o.idem_key = jobs.idem_key AND o.id <> jobs.id))"
)
_HOLDER_SELECT = (
    "SELECT "
    + ", ".join(f"h.{c}" for c in JOB_COLUMNS)
    + " FROM workspace_locks w JOIN jobs h ON h.id = w.job_id"
    f" WHERE w.workspace = ? AND h.state IN {ACTIVE_SQL}"
)
_FIRST_ACTIVE = (
    "SELECT " + ", ".join(JOB_COLUMNS) + " FROM jobs"
    f" WHERE workspace = ? AND state IN {ACTIVE_SQL} ORDER BY sort_at, id LIMIT 1"
)


# ---- queue bounds --------------------------------------------------------------------------


async def _waiting(tx: Tx, env: str | None, limit: int, *, kept: bool) -> int:
    """Jobs waiting to run (in `env`, or everywhere): as the triggers keep them (`kept`,
    SQLite), else counted up to `limit` (jobs_waiting)."""
    if kept:
        row = await tx.fetchone(
            "SELECT COALESCE(SUM(waiting), 0) AS n FROM queue_depth"
            + (" WHERE env_name = ?" if env else ""),
            (env,) if env else (),
        )
        return int(row["n"]) if row else 0
    where = f"state IN {WAITING_SQL}" + (" AND env_name = ?" if env else "")
    params = (env, limit) if env else (limit,)
    row = await tx.fetchone(
        f"SELECT COUNT(*) AS n FROM (SELECT 1 FROM jobs WHERE {where} LIMIT ?) q", params
    )
    return int(row["n"]) if row else 0


async def _started_since(tx: Tx, env: str | None, since: float) -> int:
    """Attempts started since `since` (in `env`, or everywhere): how fast the queue drains."""
    if env:
        row = await tx.fetchone(
            "SELECT COUNT(*) AS n FROM attempts a JOIN jobs j ON j.id = a.job_id"
            " WHERE a.created_at >= ? AND j.env_name = ?",
            (since, env),
        )
    else:
        row = await tx.fetchone(
            "SELECT COUNT(*) AS n FROM attempts WHERE created_at >= ?", (since,)
        )
    return int(row["n"]) if row else 0


async def check_bounds(tx: Tx, job: Job, admission: Admission, now: float, *, dialect: str) -> None:
    """Backpressure past the environment's or the global bound (see the module docstring)."""
    kept, serialise = dialect == "sqlite", dialect == "postgres"
    locked = False
    for bound, env in ((admission.env_max_queued, job.env_name), (admission.max_queued, None)):
        if bound is None:
            continue
        queued = await _waiting(tx, env, bound, kept=kept)
        if serialise and not locked and queued >= bound - PG_NEAR_BOUND:
            await tx.execute(f"SELECT pg_advisory_xact_lock({_QUEUE_LOCK})")
            locked = True
            queued = await _waiting(tx, env, bound, kept=kept)
        if queued >= bound:  # refused: count exactly for the message (this path only)
            exact = await _waiting(tx, env, 2**62, kept=kept)
            started = await _started_since(tx, env, now - admission.rate_window_s)
            raise queue_full(
                queued=exact, bound=bound, env=env, started=started, admission=admission
            )


# ---- workspace locks -----------------------------------------------------------------------


async def occupant(tx: Tx, workspace: str) -> tuple[Job, bool] | None:
    """The job the workspace belongs to: its active lock holder (True), else the first active
    job naming it in queue order (False), else None."""
    row = await tx.fetchone(_HOLDER_SELECT, (workspace,))
    if row is not None:
        return job_from_row(row), True
    row = await tx.fetchone(_FIRST_ACTIVE, (workspace,))
    return (job_from_row(row), False) if row is not None else None


async def take_at_submit(tx: Tx, job: Job, now: float) -> JobEvent:
    """Take a free workspace for a new job; StaleState when a concurrent submission got it."""
    assert job.workspace is not None
    await tx.execute(
        "DELETE FROM workspace_locks WHERE workspace = ?"
        f" AND job_id IN (SELECT id FROM jobs WHERE state IN {TERMINAL_SQL})",
        (job.workspace,),
    )
    if not await _insert_lock(tx, job, now):
        raise StaleState(f"workspace {job.workspace} taken concurrently")
    return acquired_event(job, now, 0.0)


async def _insert_lock(tx: Tx, job: Job, now: float) -> bool:
    n = await tx.execute(
        "INSERT INTO workspace_locks (workspace, job_id, acquired_at) VALUES (?, ?, ?)"
        " ON CONFLICT (workspace) DO NOTHING",
        (job.workspace, job.id, now),
    )
    return n == 1


async def note_wait(tx: Tx, job: Job, now: float) -> None:
    """The job found its workspace held: its lock wait starts now (unless it started earlier)."""
    await tx.execute(
        "INSERT INTO workspace_waits (job_id, workspace, since)"
        " SELECT id, workspace, ? FROM jobs WHERE id = ? AND state = 'QUEUED'"
        " ON CONFLICT (job_id) DO NOTHING",
        (now, job.id),
    )


async def acquire_for_start(tx: Tx, job: Job, now: float) -> bool | None:
    """Take the job's workspace as it starts: True when taken now, False when the job holds it
    already (a retry, or taken at submission), None when another active job holds it."""
    assert job.workspace is not None
    row = await tx.fetchone(
        "SELECT w.job_id, h.state FROM workspace_locks w LEFT JOIN jobs h ON h.id = w.job_id"
        " WHERE w.workspace = ?",
        (job.workspace,),
    )
    if row is not None:
        if row["job_id"] == job.id:
            return False
        if row["state"] is not None and row["state"] not in TERMINAL:
            await note_wait(tx, job, now)
            return None
        # A stale row (its holder ended without releasing it): the workspace is free.
        await tx.execute(
            "DELETE FROM workspace_locks WHERE workspace = ? AND job_id = ?",
            (job.workspace, row["job_id"]),
        )
    if not await _insert_lock(tx, job, now):  # PostgreSQL: another engine took it just now
        await note_wait(tx, job, now)
        return None
    return True


async def undo_acquire(tx: Tx, job: Job) -> None:
    """The claim that took the lock lost its compare-and-set after all: give the lock back."""
    await tx.execute(
        "DELETE FROM workspace_locks WHERE workspace = ? AND job_id = ?", (job.workspace, job.id)
    )


async def after_acquire(tx: Tx, job: Job, now: float) -> JobEvent:
    """The job took its workspace at `now`: close its wait, start the wait of the jobs queued
    behind it, and say so in its timeline."""
    row = await tx.fetchone("SELECT since FROM workspace_waits WHERE job_id = ?", (job.id,))
    wait_ms = 0.0
    if row is not None:
        wait_ms = max(0.0, (now - float(row["since"])) * 1000.0)
        await tx.execute(
            "UPDATE workspace_waits SET acquired_at = ? WHERE job_id = ?", (now, job.id)
        )
    await tx.execute(
        "INSERT INTO workspace_waits (job_id, workspace, since)"
        " SELECT id, workspace, ? FROM jobs WHERE workspace = ? AND state = 'QUEUED' AND id <> ?"
        " ON CONFLICT (job_id) DO NOTHING",
        (now, job.workspace, job.id),
    )
    return acquired_event(job, now, wait_ms)


async def release(tx: Tx, job: Job) -> None:
    """A job ended: free its workspace (if it held it) and drop a wait it never finished."""
    if job.workspace:
        await tx.execute(
            "DELETE FROM workspace_locks WHERE workspace = ? AND job_id = ?",
            (job.workspace, job.id),
        )
        await tx.execute(
            "DELETE FROM workspace_waits WHERE job_id = ? AND acquired_at IS NULL", (job.id,)
        )


async def held(tx: Tx) -> list[tuple[str, str, float]]:
    rows = await tx.fetchall(
        "SELECT workspace, job_id, acquired_at FROM workspace_locks ORDER BY workspace"
    )
    return [(r["workspace"], r["job_id"], float(r["acquired_at"])) for r in rows]


async def waits(tx: Tx, since: float) -> list[float]:
    rows = await tx.fetchall(
        "SELECT since, acquired_at FROM workspace_waits WHERE acquired_at IS NOT NULL"
        " AND acquired_at >= ? ORDER BY acquired_at, job_id",
        (since,),
    )
    return [round(max(0.0, float(r["acquired_at"]) - float(r["since"])) * 1000.0, 3) for r in rows]
