"""The core protocol: JSON Lines between a scheduler and the core.

One JSON object per line, UTF-8, at most MAX_LINE bytes, nested at most
bounds.MAX_JSON_DEPTH levels (a deeper line is answered with an error, never parsed). Every
message has a `type`; requests that expect a reply carry an `id` the reply repeats.
docs/reference/core-protocol.md is the specification for other schedulers; this module is its
single implementation of the encoding.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from pydantic import ValidationError

from corral.domain import bounds
from corral.domain.bounds import BoundError
from corral.domain.errors import CorralError
from corral.domain.models import Attempt, AttemptResult, Job, JobOptions, Permit
from corral.schemas import protocol as wire

MAX_LINE = 1 << 20  # 1 MiB: a job with a large prompt fits; a runaway writer does not
VERSION = 1

# Scheduler → core
REQUEST_PERMIT = "request_permit"
RELEASE = "release"
SUBMIT_JOB = "submit_job"
CANCEL_JOB = "cancel_job"
ADOPT = "adopt"
HEARTBEAT = "heartbeat"
CONTROL = "control"
REPORT_COST = "report_cost"
# Core → scheduler
HELLO = "hello"
PERMIT = "permit"
REJECTED = "rejected"
RELEASED = "released"
JOB_STARTED = "job_started"
JOB_COMPLETED = "job_completed"
ADOPTED = "adopted"
CONTROL_RESULT = "control_result"
COST_REPORTED = "cost_reported"
EVENT = "event"
ERROR = "error"

T = TypeVar("T")

# What a line reader hands on in place of a line longer than MAX_LINE (which it skipped).
OVERSIZED = b"\x00oversized\n"


class ProtocolError(CorralError):
    """A line that is not a valid message (malformed, oversized, unknown type)."""

    code = "protocol_error"


class _Batch:
    __slots__ = ("done", "error", "parts")

    def __init__(self, first: bytes) -> None:
        self.parts = [first]
        self.done = anyio.Event()
        self.error: BaseException | None = None


class Coalescing:
    """Writes lines to a pipe, the lines sent in one turn of the event loop in one write.

    Every write to a pipe wakes its reader, a wake-up of another CPU that costs a virtual
    machine dearly (bench/README.md, "One write per turn"), and a dispatch round sends several
    messages at once: a permit request per job, then a submission per claim. The first sender
    of a turn lets the loop turn once, then writes what the turn's senders added; each `send`
    returns once its line is written and raises what the write raised (a writer cancelled
    before it wrote: `anyio.BrokenResourceError`), as a write of its own would."""

    def __init__(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        self._write = write
        self._open: _Batch | None = None  # the batch this turn's senders join
        self._lock = anyio.Lock()  # one write at a time, in the order of the batches

    async def send(self, line: bytes) -> None:
        batch = self._open
        if batch is not None:
            batch.parts.append(line)
            await batch.done.wait()
            if batch.error is not None:
                raise batch.error
            return
        batch = self._open = _Batch(line)
        try:
            await anyio.lowlevel.checkpoint()  # the other senders of this turn join
            async with self._lock:
                if self._open is batch:
                    self._open = None
                await self._write(b"".join(batch.parts))
        except BaseException as err:
            if self._open is batch:
                self._open = None
            batch.error = (
                err
                if isinstance(err, Exception)
                else anyio.BrokenResourceError("the write of this line was cancelled")
            )
            raise
        finally:
            batch.done.set()


def encode(msg: Mapping[str, Any]) -> bytes:
    line = json.dumps(msg, separators=(",", ":"), default=str).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ProtocolError(f"message of {len(line)} bytes exceeds the {MAX_LINE}-byte limit")
    return line


def decode(line: bytes | str) -> dict[str, Any]:
    """One message from one line, or ProtocolError saying what is wrong with it."""
    if len(line) > MAX_LINE or line == OVERSIZED:
        raise ProtocolError(f"line exceeds the {MAX_LINE}-byte limit; skipped")
    try:
        msg = bounds.loads_bounded(line)
    except BoundError as err:
        raise ProtocolError(f"malformed JSON: {err}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"malformed JSON: {err}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("a message must be a JSON object")
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("a message needs a string `type`")
    return msg


def field(msg: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """A required field of the expected JSON type, or ProtocolError."""
    value = msg.get(name)
    if not isinstance(value, kind):
        raise ProtocolError(
            f"{msg.get('type')}: field `{name}` is missing or not {getattr(kind, '__name__', kind)}"
        )
    return value


# ---- domain values on the wire: the models of schemas/protocol.py ---------------------------


def job_out(j: Job) -> dict[str, Any]:
    return wire.JOB.dump(j, options=j.options.to_json())


def job_in(d: Mapping[str, Any]) -> Job:
    fields = _read(wire.JOB.load, d, "job")
    try:
        return Job(
            **{
                **fields,
                "options": JobOptions.from_json(fields["options"]),
                "limits": bounds.check_limits(fields["limits"]),
            }
        )
    except BoundError as err:
        raise ProtocolError(f"invalid job: {err}") from None


def attempt_out(a: Attempt) -> dict[str, Any]:
    return wire.ATTEMPT.dump(a)


def attempt_in(d: Mapping[str, Any]) -> Attempt:
    return Attempt(**_read(wire.ATTEMPT.load, d, "attempt"))


def permit_out(p: Permit) -> dict[str, Any]:
    return wire.PERMIT.dump_python(p, mode="json")  # type: ignore[no-any-return]


def permit_in(d: Mapping[str, Any]) -> Permit:
    return _read(wire.PERMIT.validate_python, d, "permit")


def result_out(r: AttemptResult) -> dict[str, Any]:
    return wire.RESULT.dump_python(r, mode="json")  # type: ignore[no-any-return]


def result_in(d: Mapping[str, Any]) -> AttemptResult:
    return _read(wire.RESULT.validate_python, d, "result")


def _read(validate: Callable[[Any], T], d: Any, what: str) -> T:
    """`d` validated, or ProtocolError naming the first field that is wrong and why."""
    try:
        return validate(d)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or what
        raise ProtocolError(f"invalid {what}: {where}: {first['msg']}") from None
