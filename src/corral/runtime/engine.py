"""`corral serve`: one engine per data directory, wired from the configuration."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import Process, TaskGroup

from corral.config import Config, guardrails_of
from corral.core.link import CoreLink, CoreUnavailable, connect_local
from corral.core.ports import Store
from corral.domain.errors import (
    CorralError,
    EngineFenced,
    StoreError,
)
from corral.domain.ids import new_id
from corral.domain.settings import WorkerSpec
from corral.runtime import audit, published
from corral.runtime.assembly import (
    adapter_of,
    advertise,
    build_store,
    is_shared,
    settle_heap,
)
from corral.runtime.control import serve_control
from corral.runtime.corebuild import build_core
from corral.runtime.corestart import core_argv, stop_core
from corral.runtime.flywheel import Flywheel
from corral.runtime.gate import PrerunGate
from corral.runtime.governor import Governor
from corral.runtime.modelgate import ModelGateway
from corral.runtime.peers import Peer
from corral.runtime.reporter import Reporter
from corral.runtime.retention import Retainer
from corral.runtime.servelock import ServeLock
from corral.runtime.supervisor import CoreSupervisor, SupervisorOptions
from corral.runtime.worldwatch import WorldWatch
from corral.scheduler.dispatcher import Dispatcher, DispatchOptions
from corral.scheduler.outage import StoreHealth
from corral.trace.drain import Drainer
from corral.trace.ids import OTLP_ENDPOINT_ENV
from corral.workers import credentials, privacy
from corral.workers.agents import ADAPTERS
from corral.workers.sealing import Keeper, revealer
from corral.workers.zygote import Zygote

if TYPE_CHECKING:
    from corral.trace.spans import JobSpans

log = logging.getLogger("corral.engine")

REVIVE_WAIT_S = 7.0  # how long clearing a crash loop waits for the new core (the CLI waits 10)
SOLE_HOLDER = "sole-engine"  # who holds the sinks' leases on a store only one engine serves


def role_warnings(config: Config) -> list[str]:
    """A role's max_turns that one of its worker kinds (its own, its fallbacks) cannot
    enforce, one line each, for the engine to log when it starts."""
    out = []
    for role in config.settings.roles.values():
        for kind in (role.worker, *role.fallback_workers):
            adapter = ADAPTERS.get(adapter_of(config, kind))
            if not role.max_turns or adapter is None or adapter.turn_limit == "enforced":
                continue
            what = (
                f"has no turn limit; max_turns {role.max_turns} is not applied"
                if adapter.turn_limit is None
                else f"only asks the model to stop after max_turns {role.max_turns}"
            )
            out.append(
                f"role {role.name}: worker {kind} {what} (max_tool_calls "
                f"{role.limits.max_tool_calls} bounds it)"
            )
    return out


def credential_warnings(config: Config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Each agent worker kind a role uses whose CLI is missing or visibly cannot authenticate,
    one line each, for the engine to log when it starts (its jobs would fail, unretried)."""
    roles = config.settings.roles.values()
    out = []
    for kind in sorted({k for r in roles for k in (r.worker, *r.fallback_workers)}):
        adapter = adapter_of(config, kind)
        cls = ADAPTERS.get(adapter)
        if cls is None:
            continue
        spec = config.settings.workers.get(kind) or WorkerSpec(name=kind, adapter=adapter)
        binary = spec.binary or cls.default_binary
        if shutil.which(binary) is None:
            out.append(
                f"worker {kind}: its CLI {binary!r} is not found (set workers.{kind}."
                "binary, or run scripts/agent-clis and put "
                "tests/agent-clis/node_modules/.bin on PATH): its jobs will fail, and are "
                "not retried"
            )
            continue
        models = {r.model or spec.model for r in roles if kind in (r.worker, *r.fallback_workers)}
        why = next(
            (
                w
                for m in sorted(models, key=str)
                if (w := credentials.missing(adapter, spec, m, cls.api_key_envs, environ))
            ),
            None,
        )
        if why:
            out.append(
                f"worker {kind}: its CLI cannot authenticate: {why} (in workers.{kind}.env"
                f" or, through pass_env, in the engine's environment; a login in your own"
                f" home does not reach it): its jobs will fail, and are not retried"
            )
    return out


class Engine:
    """The running engine: store, core, dispatcher and control socket in one task group."""

    def __init__(
        self, config: Config, lock: ServeLock | None = None, core: Process | None = None
    ) -> None:
        self.config = config
        # the first core child, started with `core_argv` before the engine was imported (`corral
        # serve`); the supervisor's once it starts, else stopped when the engine does
        self._first_core = core
        self.id = new_id()
        self.lock = lock or ServeLock(config.data_dir)  # `corral serve` takes it first
        self.store: Store = build_store(config)
        self.checkpointer = audit.Checkpointer(self.store, config)
        self.health = StoreHealth()  # the store's outages, ridden out (scheduler/outage.py)
        self.link = CoreLink()
        self.supervisor: CoreSupervisor | None = None
        self._tg: TaskGroup | None = None
        # Escalations raised by the engine itself (a core crash loop), shown with the core's.
        self.escalations: dict[str, dict[str, Any]] = {}
        # The core's breakers, escalations and spend, kept here so a restarted core resumes them.
        self._core_state: dict[str, Any] | None = None
        self._state_dirty = False
        self._state_changed = anyio.Event()
        self._events: list[dict[str, Any]] = []
        self.link.on_event = self._on_core_event
        rules = guardrails_of(config.settings)  # read once: the file was checked at load
        self.governor = Governor(
            store=self.store,
            settings=config.settings,
            data_dir=config.data_dir,
            adapter_of=lambda kind: adapter_of(config, kind),
            live=lambda job_id: self.dispatcher.live_claim(job_id),
            stop=lambda job_id, limit, grace: self.dispatcher.stop_for_limit(job_id, limit, grace),
            guardrails=rules,
            keeper=Keeper(config.secrets_key),
        )
        self.governor.socket_group = config.socket_group
        self.spans = _otlp_spans()
        # who else hears the engine's wake-ups: the HTTP API's kept submission service, whose
        # pre-run gate must read again after a kill switch made with the CLI (api/server.py)
        self.wake_listeners: list[Callable[[str], None]] = []
        # The knowledge flywheel: learnings injected at dispatch, rewarded and extracted when a
        # run's report is written (runtime/flywheel.py)
        self.flywheel = Flywheel(
            self.store, config.settings, workdir=config.data_dir / "knowledge" / "extract"
        )
        self.reporter = Reporter(
            self.store,
            config.settings.oversight,
            spans=self.spans,
            baselines=self.store if config.settings.scheduler.world_watch else None,
            flywheel=self.flywheel,
        )
        # Deadlocks and anomalies among live jobs, looked for every scheduler tick
        # (runtime/worldwatch.py); an anomaly of a role that says so is stopped here.
        self.worldwatch = WorldWatch(
            self.store,
            config.settings,
            stop=lambda job_id: self.dispatcher.stop_for_limit(job_id, "anomaly", 0.0),
            wake=lambda: self.wake("wake"),
        )
        # Publishes what committed to the configured sinks, in its own tasks (trace/drain.py).
        # The sinks' leases are held by engine on a shared store; on an engine's own store (one
        # engine at a time, by the data directory's lock) every engine holds them under one
        # name, so the next engine after a crash drains at once instead of when the dead one's
        # lease runs out — as the dispatcher takes over every attempt in flight there.
        holder = self.id if is_shared(config) else SOLE_HOLDER
        self.drainer = Drainer(self.store, config.settings.events, holder=holder)
        # Removes terminal jobs past retention every retention.interval_s (runtime/retention.py)
        self.retainer = Retainer(self.store, config, holder=holder)  # the same rule as the sinks
        self.gate = PrerunGate(
            self.store, config.settings, rules, reveal=revealer(Keeper(config.secrets_key))
        )
        self.governor.overrun = self.gate.overrun
        self.modelgate = ModelGateway(
            settings=config.settings,
            data_dir=config.data_dir,
            live=lambda job_id: self.dispatcher.live_claim(job_id),
            stop=lambda job_id, limit, grace: self.dispatcher.stop_for_limit(job_id, limit, grace),
            overrun=self.gate.overrun,
        )
        self.governor.gateway = self.modelgate
        self.dispatcher = Dispatcher(
            store=self.store,
            core=self.link,
            settings=config.settings,
            options=DispatchOptions(
                engine_id=self.id,
                attempts_root=config.data_dir / "attempts",
                shared=is_shared(config),
                host=socket.gethostname(),
                stale_s=config.engine.stale_after_s,
                scan_s=config.engine.heartbeat_s,
            ),
            agents=self.governor,
            gate=self.gate,
            knowledge=self.flywheel,
            on_settled=self.reporter.wake,
            health=self.health,
        )

    async def _is_job(self, job_id: str) -> bool:
        """Whether a socket's caller that names this job is one of this engine's jobs (runtime/
        peers.py): a live one, or one the store knows."""
        if self.dispatcher.live_claim(job_id) is not None:
            return True
        try:
            return (await self.store.get_job(job_id)).id == job_id
        except CorralError:
            return False

    async def _control(self, request: dict[str, Any], peer: Peer) -> dict[str, Any]:
        op = request.get("op")
        if op in ("wake", "submitted"):
            self.wake(op)
            return {"ok": True}
        if op == "ping":
            sup = self.supervisor
            return {
                "ok": True,
                "engine": self.id,
                "pid": os.getpid(),
                "inflight": self.dispatcher.inflight,
                "core_pid": sup.pid if sup else os.getpid(),
                "core_connected": sup.connected if sup else True,
                "core_restarts": (sup.generation - 1) if sup else 0,
                "core_given_up": sup.given_up if sup else False,
                "core_state_synced": not (self._state_dirty or self._state_changed.is_set()),
                "store": self.health.snapshot(),
            }
        if op == "whoami":  # what the caller may do (runtime/peers.py)
            return {"ok": True, "capability": peer.capability, "job": peer.job}
        if op == "core":
            return await self._core_control(request)
        return {"ok": False, "error": f"unknown op {op!r}"}

    def wake(self, op: str) -> bool:
        """Look now (`op` "wake": at the running jobs too; "submitted": a submission that ended
        no job, so it needs no look at them nor a report). The `Wake` of the services for an
        edge inside the engine (api/server.py).
        """
        self.dispatcher.wake(stops=op == "wake")
        if op != "submitted":  # a cancel of a queued job ends it: its report is due
            self.reporter.wake()
        for listener in self.wake_listeners:
            listener(op)
        return True

    async def _core_control(self, request: dict[str, Any]) -> dict[str, Any]:
        """Relay an operator request to the core (snapshot, reset_breaker, clear_escalation)."""
        fields = {k: v for k, v in request.items() if k not in ("op", "core_op")}
        core_op = str(request.get("core_op"))
        if core_op == "clear_escalation" and fields.get("escalation") in self.escalations:
            return await self._clear_own(self.escalations.pop(str(fields["escalation"])))
        try:
            result = await self.link.control(core_op, **fields)
        except CoreUnavailable as err:
            if core_op != "snapshot":
                return {"ok": False, "error": f"the core is not running: {err}"}
            result = {
                "breakers": [],
                "escalations": [],
                "watchdog": {},
                "permits": {},
                "core_unavailable": str(err),
            }  # the engine's own view still answers
        except CorralError as err:
            return {"ok": False, "error": str(err)}
        if core_op == "snapshot" and isinstance(result, dict):
            result["escalations"] = [*self.escalations.values(), *result.get("escalations", [])]
            # the model gateway's breakers (per provider and model) live in the engine
            result["breakers"] = [
                *result.get("breakers", []),
                *self.modelgate.breakers.snapshot(time.time()),
            ]
            sup = self.supervisor
            result["core"] = {
                "pid": sup.pid if sup else os.getpid(),
                "restarts": (sup.generation - 1) if sup else 0,
                "given_up": sup.given_up if sup else False,
            }
            result["store"] = self.health.snapshot()
            if self.drainer.sinks:
                result["events"] = await self.drainer.snapshot()
        if core_op in ("reset_breaker", "clear_escalation"):
            self._state_changed.set()
        return {"ok": True, "result": result}

    async def run(
        self,
        *,
        drain: bool = False,
        on_ready: Callable[[Engine], None] | None = None,
        also: Sequence[Callable[[Engine], Coroutine[Any, Any, None]]] = (),
    ) -> None:
        """Serve until SIGTERM/SIGINT (or, with `drain`, until nothing is left to do); `also`
        are more tasks of the engine's task group (an edge such as the HTTP API), cancelled
        with it."""
        try:
            warning = privacy.secure_data_dir(self.config.data_dir)
            if warning:
                log.warning("%s", warning)
            if not self.lock.held:
                self.lock.acquire()
            await self.store.open()
            try:
                await audit.refuse_without_triggers(self.store)
                await audit.refuse_without_key(self.store, self.config)
                for warning in await self.checkpointer.start():
                    log.error("%s", warning)
                await self._run(drain, on_ready, also)
                await self.checkpointer.flush()
            except BaseExceptionGroup as group:  # a task's own error, as itself (one line):
                ours, _ = group.split(CorralError)  # fenced by a peer, a damaged store
                if ours is None:
                    raise
                raise _first_leaf(ours) from None
            finally:
                await self.store.close()
        finally:
            # a core started for this engine that never reached its supervisor (the engine
            # stopped before: a store it could not open, a refused audit key) goes with it
            unused, self._first_core = self._first_core, None
            if unused is not None:
                await stop_core(unused)
            self.lock.release()  # (a no-op for a lock it never took)

    async def _run(
        self,
        drain: bool,
        on_ready: Callable[[Engine], None] | None,
        also: Sequence[Callable[[Engine], Coroutine[Any, Any, None]]],
    ) -> None:
        now = time.time()
        await self.store.register_engine(
            self.id, pid=os.getpid(), host=socket.gethostname(), now=now
        )
        await self.store.publish_config(published.record(self.config, self.id, now))
        for warning in (*role_warnings(self.config), *credential_warnings(self.config)):
            log.warning("%s", warning)
        settle_heap()
        ready = anyio.Event()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            if self.modelgate.wanted():  # before the core: its workers read where it listens
                await tg.start(self.modelgate.serve)
            if self.drainer.sinks:  # its brokers are reached while the core starts
                tg.start_soon(self.drainer.run)
            await self._start_core(tg)
            tg.start_soon(
                partial(
                    serve_control,
                    self.config.data_dir,
                    self._control,
                    group=self.config.socket_group,
                    is_job=self._is_job,
                )
            )
            tg.start_soon(self.governor.serve)
            tg.start_soon(self.reporter.run)
            if self.config.settings.scheduler.world_watch:
                tg.start_soon(self.worldwatch.run)
            tg.start_soon(self._heartbeat)
            tg.start_soon(self.checkpointer.run)
            tg.start_soon(self._keep_core_state)
            tg.start_soon(self._record_core_events)
            tg.start_soon(self._signals, tg.cancel_scope)
            tg.start_soon(self.retainer.run)
            for task in also:
                tg.start_soon(task, self)
            if on_ready is not None:
                tg.start_soon(_when_ready, ready, lambda: on_ready(self))
            await self.dispatcher.run(drain=drain, ready=ready)
            await self.reporter.flush()
            if self.spans is not None:  # bounded: a collector that is down costs ≤ 2 s here
                await anyio.to_thread.run_sync(self.spans.flush)
            tg.cancel_scope.cancel()  # the drainer publishes what is left as it stops

    async def _start_core(self, tg: TaskGroup) -> None:
        """The core in a supervised child (the default), or in this process."""
        cfg = self.config.core
        if cfg.mode == "inline":
            advertise(self.config)
            zygote = Zygote()
            connect_local(self.link, build_core(self.config, zygote), tg, time.time)
            tg.start_soon(_closed_at_exit, zygote)
            return
        argv = core_argv(self.config)
        assert argv is not None
        first, self._first_core = self._first_core, None
        self.supervisor = CoreSupervisor(
            self.link,
            argv,
            SupervisorOptions(
                heartbeat_s=cfg.heartbeat_s,
                heartbeat_timeout_s=cfg.heartbeat_timeout_s,
                max_restarts=cfg.max_restarts,
                window_s=cfg.restart_window_s,
            ),
            on_restart=self._core_restarted,
            on_escalation=self._escalate,
            first=first,
        )
        tg.start_soon(self.supervisor.run)
        with anyio.fail_after(30):
            await self.supervisor.wait_connected()

    async def _clear_own(self, escalation: dict[str, Any]) -> dict[str, Any]:
        """An operator clears an escalation the engine raised. For a core crash loop that means
        a core again: the supervisor starts one with a fresh restart budget, and the answer says
        whether it is up (tests/acceptance/test_supervisor.py)."""
        eid, now = str(escalation["id"]), time.time()
        await self._append_core_event(
            {
                "at": now,
                "kind": "escalation",
                "scope": "global",
                "name": "core",
                "state": "cleared",
                "severity": "info",
                "reason": "cleared",
                "message": f"escalation {eid} ({escalation['reason']}) cleared by operator",
                "data": {"id": eid, "was": escalation["reason"]},
            }
        )
        answer: dict[str, Any] = {"ok": True, "result": eid}
        sup = self.supervisor
        if escalation["reason"] != "core_crash_loop" or sup is None or self._tg is None:
            return answer
        if sup.revive():
            log.warning(
                "escalation %s cleared: starting the core again with a fresh restart budget", eid
            )
            self._tg.start_soon(sup.run)
        with anyio.move_on_after(REVIVE_WAIT_S):
            await sup.wait_connected()
        answer["core"] = {
            "pid": sup.pid,
            "connected": sup.connected,
            "restart_budget": sup.opts.max_restarts,
        }
        return answer

    async def _escalate(self, reason: str, message: str) -> None:
        log.error("escalation %s: %s", reason, message)
        eid = new_id()
        now = time.time()
        self.escalations[eid] = {
            "id": eid,
            "scope": "global",
            "target": "core",
            "reason": reason,
            "severity": "fatal",
            "message": message,
            "opened_at": now,
            "data": {},
            "action": "safe_stop_finish",
        }
        await self._append_core_event(
            {
                "at": now,
                "kind": "escalation",
                "scope": "global",
                "name": "core",
                "state": "open",
                "severity": "fatal",
                "reason": reason,
                "message": message,
                "data": {"id": eid},
            }
        )

    async def _append_core_event(self, event: dict[str, Any]) -> None:
        """Written now; during a store outage kept for `_record_core_events` to write."""
        try:
            await self.store.append_core_events([event])
        except StoreError:
            self._events.append(event)

    def _on_core_event(self, msg: dict[str, Any]) -> None:
        event = msg.get("event") or {}
        kind = event.get("kind")
        if kind in ("breaker", "escalation", "defense", "permit"):
            log.warning(
                "core %s %s %s: %s",
                kind,
                event.get("name"),
                event.get("state"),
                event.get("message"),
            )
            if kind != "permit":  # a lapsed permit changes nothing a restarted core resumes
                self._state_changed.set()
            self._events.append(event)  # refusals are counted by the core and kept per job

    async def _record_core_events(self) -> None:
        """Persist the core's decisions: `corral events` reads them, engine running or not."""
        while True:
            await anyio.sleep(0.5)
            events, self._events = self._events, []
            if not events:
                continue
            try:
                await self.store.append_core_events(events)
            except StoreError as err:  # kept for the next look: the outage is ridden out
                self._events[:0] = events
                await anyio.sleep(self.health.failed("recording core events", err))
                continue
            self.health.answered("recording core events")

    async def _keep_core_state(self) -> None:
        """Fetch the core's state as soon as it changed, so a restarted core can resume it."""
        while True:
            await self._state_changed.wait()
            self._state_changed = anyio.Event()
            self._state_dirty = True
            while self._state_dirty:
                try:
                    self._core_state = await self.link.control("state")
                    self._state_dirty = False
                except CorralError:  # the core is restarting: try again shortly
                    await anyio.sleep(0.2)

    async def _core_restarted(self) -> None:
        if self._core_state is not None:
            with contextlib.suppress(CorralError):
                await self.link.control("restore", state=self._core_state)
        await self.dispatcher.core_restarted()

    async def _heartbeat(self) -> None:
        while True:
            await anyio.sleep(self.config.engine.heartbeat_s)
            beat = await self.health.retry(
                "heart-beat", lambda: self.store.heartbeat_engine(self.id, now=time.time())
            )
            if not beat:
                log.error(
                    "this engine was declared dead by a peer (no heart-beat for %.0f s: "
                    "paused, or cut off from the database) and its attempts were taken "
                    "over; exiting without touching them",
                    self.config.engine.stale_after_s,
                )
                raise EngineFenced(
                    f"engine {self.id} lost its attempts to a peer after missing its heart-beat"
                    " (paused or cut off from the database); start it again to rejoin"
                )

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info(
                    "received %s: stopping; running attempts keep running and are "
                    "re-adopted by the next engine",
                    signal.Signals(signum).name,
                )
                scope.cancel()
                return


def _otlp_spans() -> JobSpans | None:
    """The exporter of jobs' spans when OTEL_EXPORTER_OTLP_ENDPOINT is set, else None: the
    OpenTelemetry SDK (and psutil, which its resources import) costs an engine ~90 ms to
    import, which only one that exports pays."""
    if not os.environ.get(OTLP_ENDPOINT_ENV):
        return None
    from corral.trace import spans

    return spans.from_env()


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def _when_ready(ready: anyio.Event, callback: Callable[[], None]) -> None:
    await ready.wait()
    callback()


async def _closed_at_exit(zygote: Zygote) -> None:
    """Hold the inline core's zygote until the engine stops (its shims run on)."""
    try:
        await anyio.sleep_forever()
    finally:
        zygote.close()
