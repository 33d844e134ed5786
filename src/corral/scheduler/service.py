"""The pure rules of admission the store and the submission service share: where a new job
stands on its workspace, the refusal of a submission past a queue bound and when to retry it.
The service that applies them at submission lives in
services/submissions.py."""

from __future__ import annotations

import math
from enum import StrEnum

from corral.core.ports import Admission
from corral.domain.errors import Backpressure, Conflict
from corral.domain.models import Job
from corral.domain.settings import WorkspacePolicy

RETRY_AFTER_CEILING_S = 3600.0


def retry_after_s(*, started: int, window_s: float, fallback_s: float) -> float:
    """Seconds until a full queue has room again, estimated from how fast it drained lately.

    A queue at its bound has room once one waiting job starts; `started` jobs started in the
    bound's scope in the last `window_s` seconds, so that takes about window_s / started
    (whole seconds, as HTTP's Retry-After; at least 1). Nothing started lately (no engine, a
    stalled one, or every slot held by long jobs) gives no estimate: the configured fallback.
    """
    if started <= 0 or window_s <= 0:
        return fallback_s
    return float(min(max(math.ceil(window_s / started), 1), RETRY_AFTER_CEILING_S))


class Seat(StrEnum):
    """Where a new job stands on its workspace (see `workspace_seat`)."""

    TAKE = "take"  # it takes the workspace's lock at submission
    QUEUE = "queue"  # queued; it takes the lock when it starts, in queue order
    WAIT = "wait"  # queued behind the holder: its lock wait starts now
    JOIN = "join"  # coalesced: the submission returns the occupant


def workspace_seat(job: Job, policy: WorkspacePolicy, occupant: Job | None, held: bool) -> Seat:
    """A workspace policy decision.

    `occupant` is the job the workspace belongs to now: its lock holder (`held`), else the first
    active job naming it. `reject` and `coalesce` take the lock at submission, so that "is anybody
    on this workspace?" is answered atomically with the insert (the lock table's primary key);
    `serialize` takes it when the job starts, so that jobs on one workspace run in queue order.
    """
    if occupant is None:
        return Seat.QUEUE if policy is WorkspacePolicy.SERIALIZE else Seat.TAKE
    if occupant.cancel_requested is not None:
        # It is stopping (e.g. superseded by this very job, latest-wins): neither refuse nor
        # coalesce into a job that is going away; queue behind it until it has let go.
        return Seat.WAIT if held else Seat.QUEUE
    if policy is WorkspacePolicy.REJECT:
        raise Conflict(
            f"workspace {job.workspace} is held by job {occupant.id} "
            f"({occupant.state.value}); role {job.role} has workspace_policy reject"
        )
    if policy is WorkspacePolicy.COALESCE:
        return Seat.JOIN
    return Seat.WAIT if held else Seat.QUEUE


def queue_full(
    *, queued: int, bound: int, env: str | None, started: int, admission: Admission
) -> Backpressure:
    """The refusal of a submission past a queue bound: one line naming the bound and its key."""
    after = retry_after_s(
        started=started, window_s=admission.rate_window_s, fallback_s=admission.retry_after_s
    )
    where, key = (
        (f" in environment {env}", f"environments.{env}.max_queued")
        if env
        else ("", "scheduler.max_queued")
    )
    return Backpressure(
        f"queue full: {queued} jobs queued{where} (max {bound}, {key}); retry after {after:g} s",
        after,
    )
