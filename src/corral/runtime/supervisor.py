"""The supervisor: runs `corral core` as a child, watches its heartbeats, restarts it.

A core that exits, crashes or stops answering heartbeats (SIGSTOP, a hung event loop) is killed
and restarted within `heartbeat_timeout_s` plus the restart backoff. Restarts are budgeted: more
than `max_restarts` within `window_s` is a crash loop, which escalates and stops the engine from
granting new work until an operator clears the escalation, which `revive`s the supervisor with
a fresh budget (tests/acceptance/test_supervisor.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from corral.core import protocol as p
from corral.core.link import CoreLink, CoreUnavailable
from corral.domain.errors import CorralError
from corral.runtime.corestart import spawn_core, stop_core

log = logging.getLogger("corral.supervisor")


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorOptions:
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 0.2
    # How long a starting core may take to say hello: importing and building a core takes
    # seconds on a loaded machine, which is not a hung loop (at least 2 × heartbeat_timeout_s).
    hello_timeout_s: float = 30.0


DRAIN_S = 0.25  # after a missed deadline: time for the reader to drain the pipe first


class _Beats:
    """When the core last answered, and how long since then the engine's own loop stood still
    (which does not count as the core's silence)."""

    __slots__ = ("excused", "last")

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.excused = 0.0

    def heard(self) -> None:
        self.last = time.monotonic()
        self.excused = 0.0

    def excuse(self, stalled: float, since: float) -> None:
        """The engine's loop woke `stalled` seconds late from a wait begun at `since`; a beat
        heard after `since` already ended the silence that stall belonged to."""
        if stalled > 0 and self.last <= since:
            self.excused += stalled

    def silent(self) -> float:
        return time.monotonic() - self.last - self.excused


async def _pause(seconds: float, beats: _Beats) -> None:
    """Sleep, and excuse the core for however much later than asked the engine woke up."""
    start = time.monotonic()
    await anyio.sleep(seconds)
    beats.excuse(time.monotonic() - start - seconds, start)


class CrashLoop(CorralError):
    """The core kept dying: the restart budget is spent."""

    code = "crash_loop"


class CoreSupervisor:
    """Keeps one core child alive behind a CoreLink."""

    def __init__(
        self,
        link: CoreLink,
        argv: Sequence[str],
        options: SupervisorOptions,
        *,
        on_restart: Callable[[], Coroutine[Any, Any, None]],
        on_escalation: Callable[[str, str], Awaitable[None]],
        first: Process | None = None,
    ) -> None:
        self.link = link
        self.argv = list(argv)
        self._first = first  # a core already started with `argv` (runtime/corestart.py)
        self.opts = options
        self.on_restart = on_restart
        self.on_escalation = on_escalation
        self.restarts: deque[float] = deque()
        self.pid: int | None = None
        self.generation = 0
        self.given_up = False
        self._connected = anyio.Event()

    async def wait_connected(self) -> None:
        await self._connected.wait()

    @property
    def connected(self) -> bool:
        """The current core said hello (and has not been given up on)."""
        return self._connected.is_set() and not self.given_up

    def revive(self) -> bool:
        """After a crash loop: forget the spent budget so `run` may start again. False when the
        supervisor had not given up (nothing to revive)."""
        if not self.given_up:
            return False
        self.restarts.clear()
        self.given_up = False
        self._connected = anyio.Event()
        return True

    async def run(self) -> None:
        """Start the core and keep it running until cancelled or the budget is spent."""
        while True:
            why = await self._run_once()
            self.link.disconnect(why)
            now = time.monotonic()
            self.restarts.append(now)
            while self.restarts and now - self.restarts[0] > self.opts.window_s:
                self.restarts.popleft()
            if len(self.restarts) > self.opts.max_restarts:
                self.given_up = True
                self.pid = None  # no core runs: say so, not the pid of the last dead one
                msg = (
                    f"core restarted {len(self.restarts) - 1} times in "
                    f"{self.opts.window_s:.0f}s ({why}); restart budget spent"
                )
                log.error("%s: no new work will be started", msg)
                await self.on_escalation("core_crash_loop", msg)
                return
            log.warning("core %s; restarting", why)
            await anyio.sleep(self.opts.backoff_s * len(self.restarts))

    async def _run_once(self) -> str:
        proc, self._first = self._first or await spawn_core(self.argv), None
        self.pid = proc.pid
        self.generation += 1
        assert proc.stdin is not None and proc.stdout is not None
        out = p.Coalescing(proc.stdin.send)

        async def send(msg: dict[str, Any]) -> None:
            try:
                await out.send(p.encode(msg))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as err:
                raise CoreUnavailable("the core's stdin is closed") from err

        try:
            return await self._serve(proc, send)
        finally:  # also when the engine stops: no core outlives its supervisor
            await stop_core(proc)

    async def _serve(self, proc: Process, send: Callable[[dict[str, Any]], Awaitable[None]]) -> str:
        reason = "exited"
        last_beat = _Beats()
        async with anyio.create_task_group() as tg:
            hello = anyio.Event()

            async def read() -> None:
                nonlocal reason
                reason = await self._read(proc, hello, last_beat)
                tg.cancel_scope.cancel()

            tg.start_soon(read)
            with anyio.move_on_after(
                max(self.opts.hello_timeout_s, self.opts.heartbeat_timeout_s * 2)
            ):
                await hello.wait()
            if not hello.is_set():
                reason = "did not say hello"
                tg.cancel_scope.cancel()
            else:
                self.link.connect(send)
                self._connected.set()
                if self.generation > 1:
                    tg.start_soon(self.on_restart)
                reason = await self._beat(last_beat) or reason
                tg.cancel_scope.cancel()
        return reason

    async def _read(self, proc: Process, hello: anyio.Event, last_beat: _Beats) -> str:
        assert proc.stdout is not None
        stream = BufferedByteReceiveStream(proc.stdout)
        while True:
            try:
                line = await stream.receive_until(b"\n", p.MAX_LINE)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                return "exited"
            except anyio.DelimiterNotFound:
                return "sent an oversized line"
            try:
                msg = p.decode(line)
            except p.ProtocolError as err:
                log.error("core sent a bad line (%s); ignored", err)
                continue
            if msg["type"] == p.HELLO:  # the first sign of life: the silence is counted from it,
                last_beat.heard()  # not from the spawn (a slow start is not a hung loop)
                hello.set()
            elif msg["type"] == p.HEARTBEAT:
                last_beat.heard()
            await self.link.on_message(msg)

    async def _beat(self, beats: _Beats) -> str | None:
        """Ask for a heartbeat every `heartbeat_s`; the reason to restart once the core has been
        silent for `heartbeat_timeout_s` of the engine's own running time.

        Time the engine's event loop itself stood still (a synchronous stretch on a loaded
        machine) is not the core's silence: nobody asked it, and its answers wait unread in the
        pipe. So a missed deadline is first excused by the loop's lateness, and the reader is
        given `DRAIN_S` to read what already waits before the core is declared hung."""
        timeout = self.opts.heartbeat_timeout_s
        seq = 0
        while True:
            await _pause(self.opts.heartbeat_s, beats)
            if beats.silent() > timeout:
                await _pause(DRAIN_S, beats)
                if beats.silent() > timeout:
                    return f"stopped answering heartbeats for {timeout:.1f}s"
            seq += 1
            asked = time.monotonic()
            try:
                with anyio.move_on_after(timeout):
                    await self.link.heartbeat(seq)
            except CoreUnavailable:
                return "exited"
            beats.excuse(time.monotonic() - asked - timeout, asked)  # its deadline fired late
