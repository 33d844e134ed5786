"""One root exception with a tree of subclasses; every user-facing failure is one of these."""

from __future__ import annotations


class CorralError(Exception):
    """Root of every error Corral raises on purpose. `str(err)` is a one-line message for people."""

    exit_code: int = 1


class ConfigError(CorralError):
    """The configuration is malformed or names something that does not exist."""

    exit_code = 2


class InvalidRequest(CorralError):
    """A request (submission, cancel, requeue …) is not acceptable as given."""

    exit_code = 2


class NotFound(CorralError):
    """The named job, attempt or key does not exist."""

    exit_code = 4


class Conflict(CorralError):
    """The request contradicts the current state (cancelling a terminal job, a duplicate key …)."""

    exit_code = 5


class DuplicateJob(Conflict):
    """A `reject` idempotency key is held by another job."""

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"idempotency key {key!r} is held by job {job_id}")
        self.key = key
        self.job_id = job_id


class Backpressure(CorralError):
    """The engine refuses more work for now; try again after `retry_after_s` seconds."""

    exit_code = 75  # EX_TEMPFAIL

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreError(CorralError):
    """The store cannot be reached or used (unreachable database, locked file, full disk).

    A running engine rides such an outage out, unless it is not `recoverable`."""

    exit_code = 3
    recoverable = True


class StoreBroken(StoreError):
    """The store answers but cannot be used as it is (a damaged database file): waiting does
    not help, an operator must act."""

    recoverable = False


class StaleState(CorralError):
    """A compare-and-set lost: the row was not in the expected state."""


class PermitError(CorralError):
    """A worker was asked to start without a valid, live permit.

    `reason` is the machine code the core protocol answers with (docs/reference/core-protocol.md
    lists them); `PERMIT_FORGED` unless the raiser knows better."""

    def __init__(self, message: str, reason: str = "PERMIT_FORGED") -> None:
        super().__init__(message)
        self.reason = reason


class WorkerError(CorralError):
    """A worker could not be started or supervised."""


class WorkerMisconfigured(WorkerError):
    """A worker cannot start as configured (its CLI is missing, another version, cannot
    authenticate): the worker's fault, and trying again without a fix cannot help."""


class EngineRunning(CorralError):
    """Another engine already serves this data directory."""

    exit_code = 6


class NotPermitted(CorralError):
    """An operator command asked by one of the engine's jobs (runtime/peers.py)."""

    exit_code = 10


class EngineFenced(CorralError):
    """A peer declared this engine dead (it did not heart-beat in time: paused, cut off from
    the database) and took its attempts over; it must not act on them any more."""

    exit_code = 3


class EngineNotRunning(CorralError):
    """The request needs a running engine and none answers on this data directory."""

    exit_code = 7
