"""The supervisor's heartbeat check against a real `corral core` child: a stall of the engine's
own event loop is not the core's silence, a stopped core still is."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from corral.config import load
from corral.core.link import CoreLink
from corral.domain.errors import CorralError
from corral.runtime.corestart import core_argv, spawn_core
from corral.runtime.engine import Engine
from corral.runtime.supervisor import DRAIN_S, CoreSupervisor, SupervisorOptions

OPTS = SupervisorOptions(heartbeat_s=0.1, heartbeat_timeout_s=0.6, max_restarts=5)


def _argv(tmp_path: Path) -> list[str]:
    config = tmp_path / "corral.yaml"
    config.write_text("roles:\n  default:\n    concurrency: 1\n")
    return [
        sys.executable,
        "-m",
        "corral",
        "core",
        "--data-dir",
        str(tmp_path / "data"),
        "--config",
        str(config),
    ]


def _supervisor(
    tmp_path: Path,
    escalations: list[str],
    *,
    first: Process | None = None,
    restarted: anyio.Event | None = None,
) -> CoreSupervisor:
    async def on_restart() -> None:
        if restarted is not None:
            restarted.set()

    async def escalate(kind: str, message: str) -> None:
        escalations.append(f"{kind}: {message}")

    return CoreSupervisor(
        CoreLink(), _argv(tmp_path), OPTS, on_restart=on_restart, on_escalation=escalate,
        first=first,
    )  # fmt: skip


@pytest.mark.anyio
async def test_a_stalled_engine_loop_does_not_restart_a_healthy_core(tmp_path: Path) -> None:
    escalations: list[str] = []
    sup = _supervisor(tmp_path, escalations)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.run)
        with anyio.fail_after(60):
            await sup.wait_connected()
        await anyio.sleep(3 * OPTS.heartbeat_s)  # beating normally
        first, generation = sup.pid, sup.generation  # not 1 if a start outran the hello window
        time.sleep(3 * OPTS.heartbeat_timeout_s)  # the engine's own loop stands still
        await anyio.sleep(OPTS.heartbeat_timeout_s + 5 * OPTS.heartbeat_s)
        assert sup.generation == generation and sup.pid == first, "a healthy core restarted"
        assert not escalations
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_stopped_core_is_still_restarted_within_the_timeout(tmp_path: Path) -> None:
    escalations: list[str] = []
    sup = _supervisor(tmp_path, escalations)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.run)
        with anyio.fail_after(60):
            await sup.wait_connected()
        stuck, generation = sup.pid, sup.generation
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)
        stopped = time.monotonic()
        with anyio.fail_after(60):
            while sup.generation == generation:
                await anyio.sleep(0.02)
        waited = time.monotonic() - stopped
        # the timeout, the unanswered heartbeat's own wait, one beat and the drain, no more
        bound = 2 * OPTS.heartbeat_timeout_s + OPTS.heartbeat_s + DRAIN_S + 2.0
        assert waited < bound, f"a stopped core was noticed after {waited:.2f}s"
        assert sup.pid != stuck and not escalations
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_core_started_ahead_is_the_supervisors_first(tmp_path: Path) -> None:
    """`corral serve` starts its first core before it imports the engine; the supervisor
    serves that one instead of starting another, and starts later ones itself."""
    ahead = await spawn_core(_argv(tmp_path))
    restarted = anyio.Event()
    sup = _supervisor(tmp_path, [], first=ahead, restarted=restarted)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.run)
        with anyio.fail_after(60):
            await sup.wait_connected()
        assert (sup.pid, sup.generation) == (ahead.pid, 1)
        os.kill(ahead.pid, signal.SIGKILL)
        with anyio.fail_after(60):
            await restarted.wait()  # a new core said hello
        assert sup.pid != ahead.pid
        tg.cancel_scope.cancel()
    assert ahead.returncode is not None


def test_an_engine_that_stops_before_its_core_runs_stops_the_core_started_for_it(
    tmp_path: Path,
) -> None:
    """The core `corral serve` started ahead never outlives an engine that failed before its
    supervisor took the core (here: a store file that is not a database)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "corral.db").write_bytes(b"not a database, " * 512)
    cfg = load(data_dir=data)
    argv = core_argv(cfg)
    assert argv is not None

    async def main() -> int:
        core = await spawn_core(argv)
        with pytest.raises(CorralError, match=r"damaged|not a database"):
            await Engine(cfg, None, core).run(drain=True)
        assert core.returncode is not None, "the core was left running"
        return core.pid

    pid = anyio.run(main)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
