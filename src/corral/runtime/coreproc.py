"""`corral core`: the core as a process speaking JSON Lines on stdin/stdout.

Any scheduler can drive it (docs/reference/core-protocol.md). Its attempts run in their own
sessions under corral-shim, so when this process dies they keep running and a new core adopts
them. Logs go to stderr; stdout carries protocol messages only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from typing import Any

import anyio

from corral.config import Config
from corral.core import protocol as p
from corral.core.server import CoreServer
from corral.runtime.assembly import advertise, settle_heap
from corral.runtime.corebuild import build_core
from corral.workers.zygote import Zygote

log = logging.getLogger("corral.core")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class _LineReader:
    """Lines from stdin, each at most MAX_LINE bytes; an oversized line is skipped whole and
    reported as a protocol error (returned as a marker the server answers with `error`)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    async def __call__(self) -> bytes | None:
        try:
            line = await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as err:
            return err.partial or None  # EOF: the last line without a newline, then None
        except asyncio.LimitOverrunError:
            await self._skip_line()
            return p.OVERSIZED  # answered with an `error` reply
        return line

    async def _skip_line(self) -> None:
        while True:
            try:
                await self.reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as err:
                await self.reader.readexactly(err.consumed)
            except asyncio.IncompleteReadError:
                return


async def _stdio() -> tuple[asyncio.StreamReader, Any]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=p.MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    )
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def serve_stdio(config: Config) -> None:
    """Run one core until stdin closes."""

    reader, writer = await _stdio()

    async def write(lines: bytes) -> None:
        writer.write(lines)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    out = p.Coalescing(write)

    async def send(msg: dict[str, Any]) -> None:
        await out.send(p.encode(msg))

    zygote = Zygote()
    server = CoreServer(build_core(config, zygote), send, time.time)
    settle_heap()
    try:
        with contextlib.suppress(ConnectionError):
            await server.serve(_LineReader(reader))
    finally:
        zygote.close()  # its shims run on; a new core forks its own
    log.info("scheduler closed the pipe; %d attempts keep running", len(server.running))


def main(config: Config, *, with_parent: bool = False) -> None:
    """Entry point of `corral core`."""
    if with_parent:
        _die_with_parent()
    advertise(config)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    anyio.run(serve_stdio, config)


def _die_with_parent() -> None:
    """SIGKILL when the engine that started this core dies. Left to the end of its link, a core
    whose engine was SIGKILLed went on for a moment: it saw a shim die and stopped the attempt's
    processes with nobody to tell, so the next engine's record of the attempt missed them. An
    engine's death now takes its core at once, like a core crash (its shims run on)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0
    except (OSError, AttributeError):
        failed = True
    if failed:  # the end of stdin still ends it
        log.warning("cannot ask to die with the engine; the end of its link will stop this core")
    elif os.getppid() != parent:  # it died before we asked
        os._exit(0)
