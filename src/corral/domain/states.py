"""Job and attempt states, and the only transitions between them (docs/explanation/design.md)."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    SUBMITTED = "SUBMITTED"
    DENIED = "DENIED"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD_LETTERED = "DEAD_LETTERED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def in_flight(self) -> bool:
        """A process may exist for the job (it holds a slot)."""
        return self in (JobState.STARTING, JobState.RUNNING)


TERMINAL = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.DEAD_LETTERED,
        JobState.TIMED_OUT,
        JobState.CANCELLED,
        JobState.KILLED,
        JobState.DENIED,
    }
)

ACTIVE = frozenset(set(JobState) - TERMINAL)

_J = JobState
# The only edges a job may take. RETRY_WAIT → QUEUED is the retry loop; nothing else goes back,
# and nothing leaves a terminal state (tests/unit/test_states.py walks this table).
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _J.SUBMITTED: frozenset({_J.QUEUED, _J.DENIED, _J.AWAITING_APPROVAL, _J.CANCELLED, _J.FAILED}),
    _J.AWAITING_APPROVAL: frozenset({_J.QUEUED, _J.DENIED, _J.CANCELLED}),
    _J.QUEUED: frozenset({_J.STARTING, _J.FAILED, _J.CANCELLED, _J.KILLED, _J.DENIED}),
    _J.STARTING: frozenset(
        {
            _J.RUNNING,
            _J.RETRY_WAIT,
            _J.FAILED,
            _J.DEAD_LETTERED,
            _J.TIMED_OUT,
            _J.CANCELLED,
            _J.KILLED,
            _J.SUCCEEDED,
        }
    ),
    _J.RUNNING: frozenset(
        {
            _J.SUCCEEDED,
            _J.RETRY_WAIT,
            _J.FAILED,
            _J.DEAD_LETTERED,
            _J.TIMED_OUT,
            _J.CANCELLED,
            _J.KILLED,
        }
    ),
    _J.RETRY_WAIT: frozenset({_J.QUEUED, _J.CANCELLED, _J.KILLED}),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    """True when `src → dst` is an edge of the lifecycle."""
    return dst in JOB_TRANSITIONS.get(src, frozenset())


class AttemptState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    KILLED = "KILLED"
    LOST = "LOST"  # its process vanished while the control plane was down

    @property
    def terminal(self) -> bool:
        return self not in (AttemptState.STARTING, AttemptState.RUNNING)


class DedupMode(StrEnum):
    """What a second submission with a held idempotency key does."""

    COALESCE = "coalesce"
    LATEST_WINS = "latest-wins"
    REJECT = "reject"


class Outcome(StrEnum):
    """Why an attempt ended, as the worker layer saw it (input to retry classification)."""

    EXITED = "exited"  # the process ended by itself: look at exit code / signal
    TIMED_OUT = "timed_out"  # the attempt's deadline passed
    CANCELLED = "cancelled"  # an operator or a latest-wins submission cancelled it
    KILLED = "killed"  # the kill switch stopped it
    LOST = "lost"  # the process vanished while nobody watched
    SPAWN_ERROR = "spawn_error"  # it could not start (no such binary, bad cwd …)


class Fault(StrEnum):
    """Whose failure an attempt's end was. Circuit breakers and the crash-loop rule count only
    the worker's (docs/explanation/design.md, "Whose failure"); a job's own failure says nothing
    about the provider that ran it."""

    JOB = "job"  # the job's own: its command's exit, its deadline, the agent's own verdict
    WORKER = "worker"  # the worker or its provider: a failed spawn, a crashed supervisor or
    # CLI, a model API answering 429/5xx or not at all
    CONFIG = "config"  # the worker's configuration: a CLI that cannot authenticate, an unknown
    # model. The worker's fault too, and trying again cannot help: never retried
