"""The core's side of the protocol: permits and attempts as messages.

The server owns the running attempts: it starts them under the permits it granted, watches
them, completes them in the core (which releases their permits) and reports every end as one
`job_completed`. It never trusts its peer: a malformed, oversized or unknown message gets an
`error` reply and changes nothing, an empty line is ignored, and a `submit_job` whose permit does
not authorise exactly that attempt is `rejected` with the permit's machine reason and starts
nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from corral.core import protocol as p
from corral.core.gateway import Core
from corral.core.permits import PERMIT_USED, Rejected
from corral.core.ports import AttemptHandle, AttemptRef
from corral.core.state import CoreState
from corral.domain import bounds
from corral.domain.errors import CorralError, PermitError, WorkerMisconfigured
from corral.domain.models import AttemptResult, Claimed
from corral.domain.settings import EnvSpec
from corral.domain.states import Fault, Outcome

log = logging.getLogger("corral.core")

TICK_S = 0.5  # the core's periodic work: stalls, defense stages, safe-stop cancels
QUEUED_MAX = 1024  # requests read but not handled yet; past it, reading waits

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class _Running:
    claimed: Claimed
    handle: AttemptHandle


class CoreServer:
    """Answers one scheduler's messages with the core's decisions and its attempts' results."""

    def __init__(self, core: Core, send: Send, clock: Callable[[], float]) -> None:
        self.core = core
        self.send = send
        self.clock = clock
        self.running: dict[str, _Running] = {}
        self._ready: set[str] = set()  # worker kinds whose blocking start checks have run
        self._tg: TaskGroup | None = None
        self._events: list[dict[str, Any]] = []
        self._log_sizes: dict[str, int] = {}
        core.emit.sink = lambda event: self._events.append(event.to_dict())

    async def serve(self, messages: Callable[[], Awaitable[bytes | None]]) -> None:
        """Read lines until the peer closes; attempts keep running if it goes away."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self.send(
                {"type": p.HELLO, "version": p.VERSION, "workers": sorted(self.core.kinds)}
            )
            tg.start_soon(self._ticker)
            self._watch_clusters(tg)
            # Requests are handled in order by one task; heartbeats are answered as they are
            # read, so a request that waits (a worker kind's start checks: an agent CLI asked
            # its version on a loaded machine takes seconds) never makes the core look hung.
            queue, requests = anyio.create_memory_object_stream[dict[str, Any]](QUEUED_MAX)
            done = anyio.Event()
            tg.start_soon(self._handle_in_order, requests, done)
            async with queue:
                while (line := await messages()) is not None:
                    msg = await self._decode(line)
                    if msg is None:
                        continue
                    if msg["type"] == p.HEARTBEAT:
                        await self.handle(msg)
                    else:
                        await queue.send(msg)
            await done.wait()  # what was read before the peer closed is still answered
            tg.cancel_scope.cancel()

    async def _handle_in_order(
        self, requests: MemoryObjectReceiveStream[dict[str, Any]], done: anyio.Event
    ) -> None:
        async with requests:
            async for msg in requests:
                await self.handle(msg)
        done.set()

    def attach(self, tg: TaskGroup) -> None:
        """Run attempt watchers and the ticker in the caller's task group (in-process use)."""
        self._tg = tg
        tg.start_soon(self._ticker)
        self._watch_clusters(tg)

    async def handle_line(self, line: bytes) -> None:
        msg = await self._decode(line)
        if msg is not None:
            await self.handle(msg)

    async def _decode(self, line: bytes) -> dict[str, Any] | None:
        """The message on the line; None for a blank line, or a bad one (answered `error`)."""
        if not line.strip():  # a blank line between messages is not a message
            return None
        try:
            return p.decode(line)
        except p.ProtocolError as err:
            await self.send({"type": p.ERROR, "error": str(err)})
            return None

    async def handle(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        handler = self._handlers.get(kind)
        if handler is None:
            await self.send(
                {"type": p.ERROR, "id": msg.get("id"), "error": f"unknown message type {kind!r}"}
            )
            return
        try:
            await handler(self, msg)
        except CorralError as err:  # a bad field or value: answered, never fatal to the core
            await self.send({"type": p.ERROR, "id": msg.get("id"), "error": str(err)})
        except Exception as err:  # a bug met by one request must not stop the core for all
            log.exception("handling %s failed", kind)
            error = f"internal error handling {kind}: {type(err).__name__}"
            await self.send({"type": p.ERROR, "id": msg.get("id"), "error": error})
        await self._flush_events()

    async def _flush_events(self, *, saturated: bool = False) -> None:
        """Send the core's events; `saturated` also when they freed slots (a lapsed permit)."""
        events, self._events = self._events, []
        for event in events:
            msg: dict[str, Any] = {"type": p.EVENT, "event": event}
            if saturated:
                msg["saturated"] = self._saturated()
            await self.send(msg)

    # ---- handlers ------------------------------------------------------------------------

    async def _request_permit(self, msg: dict[str, Any]) -> None:
        job = p.job_in(p.field(msg, "job", dict))
        index = p.field(msg, "attempt", int)
        decision = self.core.request_permit(job, index, self.clock())
        saturated = self._saturated()
        if isinstance(decision, Rejected):
            await self.send(
                {
                    "type": p.REJECTED,
                    "id": msg.get("id"),
                    "job_id": job.id,
                    "reason": decision.reason,
                    "message": decision.message,
                    "retry_after_s": decision.retry_after_s,
                    "final": decision.final,
                    "saturated": saturated,
                }
            )
            return
        await self.send(
            {
                "type": p.PERMIT,
                "id": msg.get("id"),
                "job_id": job.id,
                "permit": p.permit_out(decision),
                "saturated": saturated,
            }
        )

    async def _release(self, msg: dict[str, Any]) -> None:
        permit = p.permit_in(p.field(msg, "permit", dict))
        try:
            self.core.gate.validate(permit)
        except PermitError as err:
            await self.send({"type": p.ERROR, "id": msg.get("id"), "error": str(err)})
            return
        if permit.job_id not in self.running:
            self.core.release(permit)
        await self.send(
            {
                "type": p.RELEASED,
                "id": msg.get("id"),
                "permit_id": permit.id,
                "saturated": self._saturated(),
            }
        )

    async def _submit_job(self, msg: dict[str, Any]) -> None:
        job = p.job_in(p.field(msg, "job", dict))
        claimed = Claimed(
            job=job,
            attempt=p.attempt_in(p.field(msg, "attempt", dict)),
            permit=p.permit_in(p.field(msg, "permit", dict)),
        )
        running = self.running.get(job.id)
        if running is not None and running.claimed.permit.id == claimed.permit.id:
            await self._refuse(
                msg,
                claimed,
                PermitError(
                    f"permit {claimed.permit.id} already started attempt "
                    f"{running.claimed.attempt.index} of job {job.id}, which runs",
                    PERMIT_USED,
                ),
            )
            return
        if running is not None:
            await self.send(
                {
                    "type": p.ERROR,
                    "id": msg.get("id"),
                    "error": f"job {job.id} already has a running attempt",
                }
            )
            return
        # Off the event loop, once per worker kind: a CLI asked its version must not cost the
        # core its heartbeats, and a start must not cost a thread hop. What the check finds
        # (the version, or what is wrong) is cached: launch reads it, and raises it again.
        kind = claimed.permit.granted.get("worker", job.worker)
        if kind not in self._ready:
            with contextlib.suppress(CorralError):
                await anyio.to_thread.run_sync(self.core.ready, claimed)
            self._ready.add(kind)
        try:
            handle = self.core.launch(claimed, self.clock())
        except PermitError as err:  # nothing started; the permit's holder keeps its slot
            await self._refuse(msg, claimed, err)
            return
        except CorralError as err:  # the worker could not start it: its fault, not the job's
            fault = Fault.CONFIG if isinstance(err, WorkerMisconfigured) else Fault.WORKER
            result = AttemptResult(outcome=Outcome.SPAWN_ERROR, error=str(err), fault=fault)
            await self._completed(claimed, result, msg.get("id"))
            return
        self.running[job.id] = _Running(claimed=claimed, handle=handle)
        await self.send(
            {
                "type": p.JOB_STARTED,
                "id": msg.get("id"),
                "job_id": job.id,
                "attempt_id": claimed.attempt.id,
                **_where(handle.ref),
            }
        )
        self._watch(claimed, handle)

    async def _refuse(self, msg: dict[str, Any], c: Claimed, err: PermitError) -> None:
        """A `submit_job` whose permit does not authorise that attempt: nothing started."""
        await self.send(
            {
                "type": p.REJECTED,
                "id": msg.get("id"),
                "job_id": c.job.id,
                "attempt_id": c.attempt.id,
                "permit_id": c.permit.id,
                "reason": err.reason,
                "message": str(err),
                "final": True,
                "saturated": self._saturated(),
            }
        )

    async def _adopt(self, msg: dict[str, Any]) -> None:
        job = p.job_in(p.field(msg, "job", dict))
        attempt = p.attempt_in(p.field(msg, "attempt", dict))
        if job.id in self.running:  # already ours (a scheduler that re-sends after a blip)
            r = self.running[job.id]
            await self.send(
                {"type": p.ADOPTED, "id": msg.get("id"), "job_id": job.id, **_where(r.handle.ref)}
            )
            return
        try:
            worker = msg.get("worker") if isinstance(msg.get("worker"), str) else None
            permit, found = self.core.adopt(job, attempt, self.clock(), worker=worker)
        except CorralError as err:
            await self.send({"type": p.ERROR, "id": msg.get("id"), "error": str(err)})
            return
        claimed = Claimed(job=job, attempt=attempt, permit=permit)
        if isinstance(found, AttemptResult):
            await self._completed(claimed, found, msg.get("id"))
            return
        self.running[job.id] = _Running(claimed=claimed, handle=found)
        await self.send(
            {"type": p.ADOPTED, "id": msg.get("id"), "job_id": job.id, **_where(found.ref)}
        )
        self._watch(claimed, found)

    async def _cancel_job(self, msg: dict[str, Any]) -> None:
        job_id = p.field(msg, "job_id", str)
        r = self.running.get(job_id)
        if r is None:
            await self.send(
                {
                    "type": p.ERROR,
                    "id": msg.get("id"),
                    "job_id": job_id,
                    "error": f"cancel_job: no running attempt of job {job_id}",
                }
            )
            return
        self.core.note_stop_requested(job_id, self.clock())
        r.handle.stop(now_kill=bool(msg.get("now")))

    async def _report_cost(self, msg: dict[str, Any]) -> None:
        """Cost of a job's attempt measured outside the core (a foreign scheduler's worker)."""
        job_id = p.field(msg, "job_id", str)
        usd = p.field(msg, "cost_usd", (int, float))
        if isinstance(usd, bool):
            raise p.ProtocolError("report_cost: field `cost_usd` is not a number")
        usd = bounds.usd("report_cost: cost_usd", usd)
        charged = self.core.report_cost(job_id, float(usd), self.clock())
        await self.send({"type": p.COST_REPORTED, "id": msg.get("id"), **charged})

    async def _heartbeat(self, msg: dict[str, Any]) -> None:
        await self.send(
            {
                "type": p.HEARTBEAT,
                "id": msg.get("id"),
                "seq": msg.get("seq"),
                "inflight": len(self.running),
                "permits": self.core.gate.live,
            }
        )

    async def _control(self, msg: dict[str, Any]) -> None:
        """Operator requests relayed by the scheduler (`corral breakers`, `escalations` …)."""
        op, now = msg.get("op"), self.clock()
        try:
            if op == "snapshot":
                result: Any = self.core.snapshot(now)
            elif op == "state":
                result = self.core.state().to_dict()
            elif op == "restore":
                self.core.restore(CoreState.from_dict(p.field(msg, "state", dict)))
                result = None
            elif op == "reset_breaker":
                self.core.reset_breaker(p.field(msg, "name", str), now)
                result = None
            elif op == "clear_escalation":
                result = self.core.clear_escalation(p.field(msg, "escalation", str), now).id
            elif op == "report_metric":
                value = bounds.number(
                    "report_metric: value",
                    p.field(msg, "value", (int, float)),
                    low=-sys.float_info.max,
                    high=sys.float_info.max,
                )
                self.core.report_metric(p.field(msg, "name", str), value, now)
                result = None
            elif op == "note_superseded":
                self.core.note_superseded(p.field(msg, "workspace", str), now)
                result = None
            else:
                raise p.ProtocolError(f"unknown control op {op!r}")
        except CorralError as err:
            await self.send({"type": p.ERROR, "id": msg.get("id"), "error": str(err)})
            return
        await self.send({"type": p.CONTROL_RESULT, "id": msg.get("id"), "op": op, "result": result})

    # ---- time ----------------------------------------------------------------------------

    async def _ticker(self) -> None:
        """Every TICK_S: the core's periodic work, activity from log growth, events out."""
        while True:
            await anyio.sleep(TICK_S)
            now = self.clock()
            for job_id, r in list(self.running.items()):
                r.handle.check(now)  # a supervisor that stopped answering is replaced by us
                size = _log_size(r.claimed.attempt.dir)
                if size != self._log_sizes.get(job_id):
                    self._log_sizes[job_id] = size
                    self.core.note_activity(job_id, now)
            live = self.core.gate.live
            for job_id in self.core.tick(now):
                stopping = self.running.get(job_id)
                if stopping is not None:  # a global safe stop that cancels running work
                    self.core.note_stop_requested(job_id, now)
                    stopping.handle.stop()
            await self._flush_events(saturated=self.core.gate.live != live)

    def _watch_clusters(self, tg: TaskGroup) -> None:
        """One health probe per Ray environment, when the core was given a probe."""
        probe = self.core.options.cluster_probe
        if probe is None:
            return
        for env in self.core.gate.settings.environments.values():
            if env.kind == "ray" and env.address:
                tg.start_soon(self._cluster_health, env, probe)

    async def _cluster_health(self, env: EnvSpec, probe: Callable[[EnvSpec], str | None]) -> None:
        """Every `health_interval_s`: ask the cluster (in a thread: it is a blocking HTTP call
        bounded by its timeout) and tell the core, which opens or closes the env's breaker."""
        while True:
            try:
                error = await anyio.to_thread.run_sync(probe, env, abandon_on_cancel=True)
            except Exception as err:  # a probe that breaks is a cluster not known to answer
                error = f"health probe failed: {type(err).__name__}"
            self.core.note_cluster(env.name, error, self.clock())
            await self._flush_events()
            await anyio.sleep(env.health_interval_s)

    _handlers: dict[str, Callable[[CoreServer, dict[str, Any]], Awaitable[None]]] = {
        p.REQUEST_PERMIT: _request_permit,
        p.RELEASE: _release,
        p.SUBMIT_JOB: _submit_job,
        p.ADOPT: _adopt,
        p.CANCEL_JOB: _cancel_job,
        p.HEARTBEAT: _heartbeat,
        p.CONTROL: _control,
        p.REPORT_COST: _report_cost,
    }

    # ---- attempts ------------------------------------------------------------------------

    def _watch(self, claimed: Claimed, handle: AttemptHandle) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._wait, claimed, handle)

    async def _wait(self, claimed: Claimed, handle: AttemptHandle) -> None:
        result = await handle.wait()
        self.running.pop(claimed.job.id, None)
        self._log_sizes.pop(claimed.job.id, None)
        if result.outcome is not Outcome.EXITED:
            ghosts = handle.survivors()
            if ghosts:  # stopped, yet its processes were still there: ghosts (now stopped)
                self.core.note_ghosts(claimed.job.id, ghosts, self.clock())
        await self._completed(claimed, result, None)

    def _saturated(self) -> dict[str, list[str]]:
        """Scopes with no free slot, sent with every reply that changes them so the scheduler
        does not even ask for permits it cannot get."""
        roles, envs = self.core.gate.full()
        return {"roles": sorted(roles), "envs": sorted(envs)}

    async def _completed(self, c: Claimed, result: AttemptResult, req: object) -> None:
        result = self.core.complete(c.permit, c.job, result, self.clock())
        await self.send(
            {
                "type": p.JOB_COMPLETED,
                "id": req,
                "job_id": c.job.id,
                "attempt_id": c.attempt.id,
                "result": p.result_out(result),
                "saturated": self._saturated(),
            }
        )
        await self._flush_events()  # what this result changed (a breaker …) follows it at once


def _where(ref: AttemptRef) -> dict[str, Any]:
    """Where a started or adopted attempt runs, on the wire: its reference, and for a local
    process its pid as well (for people reading the core's stream)."""
    return {"ref": str(ref), "pid": ref.pid}


def _log_size(attempt_dir: str) -> int:
    total = 0
    for name in ("stdout.log", "stderr.log"):
        with contextlib.suppress(OSError):
            total += os.stat(os.path.join(attempt_dir, name)).st_size
    return total
