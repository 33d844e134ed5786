"""How `corral serve` starts its core child: the command line and the spawn, without the engine.

`corral serve` starts the first core before it imports the engine (`corral.runtime.engine` and
what it pulls in: a quarter of a second of the engine's start-up), so the core's own start, about
as long, runs beside it on the machine's other CPU instead of after it. The supervisor
(runtime/supervisor.py) spawns every later one the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

import anyio
from anyio.abc import Process

from corral.config import Config


def core_argv(config: Config) -> list[str] | None:
    """The core child's command line; None when the core runs in the engine (`core.mode:
    inline`)."""
    if config.core.mode == "inline":
        return None
    argv = [sys.executable, "-m", "corral", "core", "--with-parent"]
    argv += ["--data-dir", str(config.data_dir)]
    if config.source is not None:
        argv += ["--config", str(config.source)]
    return argv


async def spawn_core(argv: Sequence[str]) -> Process:
    """A core child speaking the protocol on its stdin and stdout, in a session of its own (a
    Ctrl-C at the engine's terminal is the engine's to handle); its logs on our stderr."""
    return await anyio.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,
        start_new_session=True,
    )


async def stop_core(proc: Process) -> None:
    """Make sure a core child is gone and reaped (SIGKILL reaches a stopped process too)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        await proc.wait()
    with contextlib.suppress(Exception):
        await proc.aclose()
