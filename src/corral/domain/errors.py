"""One root exception with a tree of subclasses; every user-facing failure is one of these.

Each class carries a machine `code` (a subclass without its own shares its parent's). What an
edge makes of a code is the edge's business: the CLI maps it to an exit code in one table
(cli/exits.py), an HTTP API to a status; the domain says what went wrong, not how to exit."""

from __future__ import annotations


class CorralError(Exception):
    """Root of every error Corral raises on purpose. `str(err)` is a one-line message for people."""

    code: str = "error"


class ConfigError(CorralError):
    """The configuration is malformed or names something that does not exist."""

    code = "config_invalid"


class InvalidRequest(CorralError):
    """A request (submission, cancel, requeue …) is not acceptable as given."""

    code = "invalid_request"


class NotFound(CorralError):
    """The named job, attempt or key does not exist."""

    code = "not_found"


class Conflict(CorralError):
    """The request contradicts the current state (cancelling a terminal job, a duplicate key …)."""

    code = "conflict"


class DuplicateJob(Conflict):
    """A `reject` idempotency key is held by another job."""

    code = "duplicate_key"

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"idempotency key {key!r} is held by job {job_id}")
        self.key = key
        self.job_id = job_id


class Backpressure(CorralError):
    """The engine refuses more work for now; try again after `retry_after_s` seconds."""

    code = "backpressure"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreError(CorralError):
    """The store cannot be reached or used (unreachable database, locked file, full disk).

    A running engine rides such an outage out, unless it is not `recoverable`."""

    code = "store_unavailable"
    recoverable = True


class StoreBroken(StoreError):
    """The store answers but cannot be used as it is (a damaged database file): waiting does
    not help, an operator must act."""

    code = "store_broken"
    recoverable = False


class StaleState(CorralError):
    """A compare-and-set lost: the row was not in the expected state."""

    code = "stale_state"


class PermitError(CorralError):
    """A worker was asked to start without a valid, live permit.

    `reason` is the machine code the core protocol answers with (docs/reference/core-protocol.md
    lists them); `PERMIT_FORGED` unless the raiser knows better."""

    code = "permit_refused"

    def __init__(self, message: str, reason: str = "PERMIT_FORGED") -> None:
        super().__init__(message)
        self.reason = reason


class WorkerError(CorralError):
    """A worker could not be started or supervised."""

    code = "worker_failed"


class WorkerMisconfigured(WorkerError):
    """A worker cannot start as configured (its CLI is missing, another version, cannot
    authenticate): the worker's fault, and trying again without a fix cannot help."""

    code = "worker_misconfigured"


class EngineRunning(CorralError):
    """Another engine already serves this data directory."""

    code = "engine_running"


class NotPermitted(CorralError):
    """An operator command asked by one of the engine's jobs (runtime/peers.py)."""

    code = "not_permitted"


class EngineFenced(CorralError):
    """A peer declared this engine dead (it did not heart-beat in time: paused, cut off from
    the database) and took its attempts over; it must not act on them any more."""

    code = "engine_fenced"


class EngineNotRunning(CorralError):
    """The request needs a running engine and none answers on this data directory."""

    code = "engine_not_running"
