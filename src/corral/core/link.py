"""The scheduler's side of the core protocol: requests out, replies and results back.

A `CoreLink` outlives the core process it talks to: when the core dies, requests in flight fail
with `CoreUnavailable`, while the results the scheduler waits for stay pending until a restarted
core re-adopts the attempts and reports them.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from corral.core import protocol as p
from corral.core.gateway import Core
from corral.core.permits import PERMIT_USED, Rejected
from corral.core.ports import AttemptRef
from corral.core.server import CoreServer
from corral.domain.errors import CorralError
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, Permit
from corral.domain.states import Outcome

log = logging.getLogger("corral.core")

Send = Callable[[dict[str, Any]], Awaitable[None]]


class CoreUnavailable(CorralError):
    """The core is not connected (starting, restarting, or given up on)."""

    code = "core_unavailable"


class _Slot:
    """A value that arrives later, exactly once."""

    __slots__ = ("_done", "error", "value")

    def __init__(self) -> None:
        self._done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def set(self, value: Any) -> None:
        if not self._done.is_set():
            self.value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self.error = error
            self._done.set()

    async def get(self) -> Any:
        await self._done.wait()
        if self.error is not None:
            raise self.error
        return self.value


class CoreLink:
    """Talks to one core at a time; survives its restarts."""

    def __init__(self) -> None:
        self._send: Send | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._results: dict[str, _Slot] = {}
        self.saturated: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
        self.on_event: Callable[[dict[str, Any]], None] | None = None
        self.errors: deque[str] = deque(maxlen=100)  # the core's unsolicited complaints

    # ---- transport -----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._send is not None

    def connect(self, send: Send) -> None:
        self._send = send

    def disconnect(self, why: str) -> None:
        """The core went away: fail what waits for a reply; results stay pending."""
        self._send = None
        pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.fail(CoreUnavailable(why))

    async def on_message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if "saturated" in msg:
            sat = msg["saturated"]
            self.saturated = (frozenset(sat.get("roles", ())), frozenset(sat.get("envs", ())))
        if kind == p.JOB_COMPLETED:
            self._result_slot(str(msg.get("job_id"))).set(p.result_in(msg["result"]))
        elif kind == p.EVENT and self.on_event is not None:
            self.on_event(msg)
        elif kind == p.ERROR and msg.get("id") is None:
            log.warning("the core reported: %s", msg.get("error"))
            self.errors.append(str(msg.get("error")))
        request = msg.get("id")
        if isinstance(request, int) and request in self._pending:
            self._pending.pop(request).set(msg)

    async def _request(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._send is None:
            raise CoreUnavailable("the core is not connected")
        rid = next(self._ids)
        slot = self._pending[rid] = _Slot()
        await self._send({**msg, "id": rid})
        reply: dict[str, Any] = await slot.get()
        if reply.get("type") == p.ERROR:
            raise CorralError(f"core refused {msg['type']}: {reply.get('error')}")
        return reply

    async def _tell(self, msg: dict[str, Any]) -> None:
        if self._send is None:
            raise CoreUnavailable("the core is not connected")
        await self._send(msg)

    def _result_slot(self, job_id: str) -> _Slot:
        slot = self._results.get(job_id)
        if slot is None:
            slot = self._results[job_id] = _Slot()
        return slot

    # ---- the scheduler's calls ------------------------------------------------------------

    async def request_permit(self, job: Job, attempt_index: int) -> Permit | Rejected:
        reply = await self._request(
            {"type": p.REQUEST_PERMIT, "job": p.job_out(job), "attempt": attempt_index}
        )
        if reply["type"] == p.PERMIT:
            return p.permit_in(reply["permit"])
        retry = reply.get("retry_after_s")
        return Rejected(
            reason=str(reply.get("reason")),
            message=str(reply.get("message", "")),
            retry_after_s=float(retry) if isinstance(retry, int | float) else None,
            final=bool(reply.get("final")),
        )

    async def release(self, permit: Permit) -> None:
        await self._request({"type": p.RELEASE, "permit": p.permit_out(permit)})

    async def submit(self, c: Claimed) -> AttemptRef | AttemptResult:
        """Start the attempt: where it runs, or the result when it could not start."""
        self._results.pop(c.job.id, None)
        reply = await self._request(
            {
                "type": p.SUBMIT_JOB,
                "job": p.job_out(c.job),
                "attempt": p.attempt_out(c.attempt),
                "permit": p.permit_out(c.permit),
            }
        )
        return self._started(reply, c.job.id)

    async def adopt(self, job: Job, attempt: Attempt) -> AttemptRef | AttemptResult:
        """Hand an attempt found in flight to the core: where it runs, or how it ended."""
        reply = await self._request(
            {"type": p.ADOPT, "job": p.job_out(job), "attempt": p.attempt_out(attempt)}
        )
        return self._started(reply, job.id)

    async def readopt(self, job: Job, attempt: Attempt, worker: str | None = None) -> None:
        """After a core restart: tell the new core about an attempt someone already waits on
        with `result()`; its end is reported there, not here."""
        await self._request(
            {
                "type": p.ADOPT,
                "job": p.job_out(job),
                "attempt": p.attempt_out(attempt),
                "worker": worker,
            }
        )

    def _started(self, reply: dict[str, Any], job_id: str) -> AttemptRef | AttemptResult:
        if reply["type"] == p.JOB_COMPLETED:
            self._results.pop(job_id, None)
            return p.result_in(reply["result"])
        if reply["type"] == p.REJECTED:  # the permit does not authorise it: nothing started
            return refused_result(str(reply.get("reason")), str(reply.get("message", "")))
        return AttemptRef.parse(str(reply["ref"]))

    async def result(self, job_id: str) -> AttemptResult:
        """Wait for the attempt of this job to end (across core restarts)."""
        value: AttemptResult = await self._result_slot(job_id).get()
        self._results.pop(job_id, None)
        return value

    async def cancel(self, job_id: str, *, now: bool = False) -> None:
        # With an id nobody waits on: "no running attempt" (it just ended) is not worth a log.
        await self._tell(
            {"type": p.CANCEL_JOB, "id": next(self._ids), "job_id": job_id, "now": now}
        )

    async def heartbeat(self, seq: int) -> dict[str, Any]:
        return await self._request({"type": p.HEARTBEAT, "seq": seq})

    async def control(self, op: str, **fields: Any) -> Any:
        """An operator request for the core (snapshot, reset_breaker, clear_escalation …)."""
        reply = await self._request({"type": p.CONTROL, "op": op, **fields})
        return reply.get("result")


def refused_result(reason: str, message: str) -> AttemptResult:
    """What a refused `submit_job` means for the attempt the scheduler recorded: nothing started
    for it, so it is lost and retried within the job's bounds (a permit from a core that died
    meanwhile, one that expired while the store was slow). Only a permit that already started
    an attempt is a failure: something may be running under it, so nothing is retried."""
    outcome = Outcome.SPAWN_ERROR if reason == PERMIT_USED else Outcome.LOST
    return AttemptResult(outcome=outcome, error=f"permit refused ({reason}): {message}")


def connect_local(
    link: CoreLink, core: Core, tg: TaskGroup, clock: Callable[[], float]
) -> CoreServer:
    """Serve `link` from a core in this process, through the same messages and JSON encoding
    as a core child (used by tests, benchmarks and `core.mode: inline`)."""

    async def to_link(msg: dict[str, Any]) -> None:
        await link.on_message(p.decode(p.encode(msg)))

    server = CoreServer(core, to_link, clock)
    server.attach(tg)

    async def to_server(msg: dict[str, Any]) -> None:
        await server.handle_line(p.encode(msg))

    link.connect(to_server)
    return server
