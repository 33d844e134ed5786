"""`corral wait` and `corral submit --wait`: follow a job to its end, saying why it waits.

Three ways to show it: on a terminal a live status line (rich) on stderr; elsewhere one line on
stderr each time the job is held back by something new (an open breaker, a pause, an approval,
no engine); nothing with `--quiet` or `--json`. `--follow` copies the job's output as it comes:
its stdout to stdout, its stderr to stderr. No engine serving the data directory fails at once
(exit 7) unless `--no-engine-ok`: the job would wait forever.
"""

from __future__ import annotations

import codecs
import os
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import anyio

from corral.config import Config
from corral.core.ports import Operations
from corral.domain.errors import EngineNotRunning
from corral.domain.models import Attempt, Job
from corral.domain.states import JobState
from corral.runtime.watch import Watcher, engine_serving
from corral.scheduler.waiting import Wait, why
from corral.services import world

if TYPE_CHECKING:
    from rich.live import Live

LOOK_S = 1.0  # how often the reasons are looked at again (the state: every 0.25 s at most)
SETTLE_S = 1.0  # a reason shown as a line once it held this long (no noise for a quick start)
ENGINE_GRACE_S = 5.0  # how long a wait gives an engine that was just started to answer
CHUNK = 1 << 16
JOB_ENV = "CORRAL_JOB_ID"  # set in every attempt's environment: the job it runs


class Mode(Enum):
    QUIET = "quiet"  # --quiet, --json
    LINES = "lines"  # stderr is not a terminal
    LIVE = "live"  # stderr is a terminal


def mode_for(*, quiet: bool) -> Mode:
    if quiet:
        return Mode.QUIET
    return Mode.LIVE if sys.stderr.isatty() else Mode.LINES


@dataclass(frozen=True, slots=True, kw_only=True)
class Follow:
    """How to follow a job."""

    until: str = "end"  # or "running"
    timeout: float | None = None
    mode: Mode = Mode.LINES
    output: bool = False  # --follow: copy its output
    no_engine_ok: bool = False


class Output:
    """New bytes of a job's attempt logs, in order, attempt by attempt."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[int, str], int] = {}

    def read(self, attempts: list[Attempt]) -> list[tuple[str, bytes]]:
        out = []
        for a in attempts:
            for name in ("stdout", "stderr"):
                key = (a.index, name)
                offset = self.offsets.get(key, 0)
                try:
                    with (Path(a.dir) / f"{name}.log").open("rb") as f:
                        f.seek(offset)
                        while chunk := f.read(CHUNK):
                            out.append((name, chunk))
                            offset += len(chunk)
                except FileNotFoundError:
                    pass
                self.offsets[key] = offset
        return out


class Display:
    """The status of a job while it waits, in the chosen mode."""

    def __init__(self, mode: Mode, label: str) -> None:
        self.mode = mode
        self.label = label
        self.started = time.monotonic()
        self.live: Live | None = None
        self._said: str | None = None
        self._since: tuple[str, float] | None = None  # a reason and when it was first seen
        self._decoders = {
            n: codecs.getincrementaldecoder("utf-8")("replace") for n in ("stdout", "stderr")
        }

    def __enter__(self) -> Display:
        if self.mode is Mode.LIVE:
            from rich.console import Console
            from rich.live import Live
            from rich.spinner import Spinner

            self.live = Live(
                Spinner("dots", text=self.label),
                console=Console(stderr=True),
                refresh_per_second=8,
                transient=True,
                redirect_stdout=sys.stdout.isatty(),
                redirect_stderr=True,
            )
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def status(self, job: Job, wait: Wait) -> None:
        if self.mode is Mode.LIVE and self.live is not None:
            from rich.spinner import Spinner
            from rich.text import Text

            line = Text.assemble(
                (f"{self.label} ", "bold"),
                (f"{job.state.value} ", "cyan"),
                wait.text,
                (f"  {_elapsed(self.started)}", "dim"),
            )
            self.live.update(Spinner("dots", text=line))
        elif self.mode is Mode.LINES:
            self._line(job, wait)

    def _line(self, job: Job, wait: Wait) -> None:
        """One line when a reason that holds the job back has lasted SETTLE_S, once per reason
        (its words may change meanwhile: "in 28s", "in 27s")."""
        if not wait.blocked:
            self._since = None
            return
        now = time.monotonic()
        if self._since is None or self._since[0] != wait.code:
            self._since = (wait.code, now)
        if wait.code != self._said and now - self._since[1] >= SETTLE_S:
            self._said = wait.code
            print(
                f"corral: {self.label} is {job.state.value}: {wait.text}",
                file=sys.stderr,
                flush=True,
            )

    def output(self, stream: str, data: bytes) -> None:
        """Copy a piece of the job's output where it belongs."""
        target = sys.stdout if stream == "stdout" else sys.stderr
        if self.live is not None and (stream == "stderr" or sys.stdout.isatty()):
            target.write(self._decoders[stream].decode(data))  # through rich's proxy
            target.flush()
            return
        raw: BinaryIO = target.buffer
        raw.write(data)
        raw.flush()

    def ended(self, job: Job) -> None:
        """The job ended: on a terminal, the status line gives way to one line saying how."""
        self.__exit__()
        if self.mode is not Mode.LIVE:
            return
        from rich.console import Console

        ok = job.state is JobState.SUCCEEDED
        mark, style = ("✓", "green") if ok else ("✗", "red")
        tail = "" if ok or not job.last_error else f": {job.last_error}"
        Console(stderr=True, highlight=False).print(
            f"[{style}]{mark}[/{style}] {self.label} {job.state.value} after "
            f"{_elapsed(self.started)}{tail}",
            markup=True,
        )


def _elapsed(started: float) -> str:
    s = int(time.monotonic() - started)
    return f"{s // 60}:{s % 60:02d}"


async def follow(cfg: Config, store: Operations, ref: str, how: Follow) -> tuple[Job, int | None]:
    """Follow the job until it ends (or runs, or the timeout): the job as last seen, and None
    when the timeout came first."""
    job = await store.get_job(ref)
    label = (await store.short_ids([job.id])).get(job.id, job.id)
    engine = await engine_serving(cfg, store, time.time())
    grace = time.monotonic() + ENGINE_GRACE_S  # `corral serve &` may be starting right now
    while not engine and not job.state.terminal and time.monotonic() < grace:
        await anyio.sleep(0.2)
        engine = await engine_serving(cfg, store, time.time())
    if not engine and not job.state.terminal and not how.no_engine_ok:
        raise EngineNotRunning(
            f"no engine is serving {cfg.data_dir}: job {label} stays {job.state.value} until "
            "`corral serve` runs there (pass --no-engine-ok to wait anyway)"
        )
    # From inside a job, the wait is recorded on that job's timeline while it lasts: the world
    # model shows the edge, and its deadlock watch sees a parent waiting on its own child.
    waiter = os.environ.get(JOB_ENV)
    recorded = bool(waiter) and await world.record_wait(store, str(waiter), job.id, started=True)
    try:
        with Display(how.mode, label) as display:
            return await _loop(cfg, store, job, how, display, engine)
    finally:
        if recorded:
            with anyio.CancelScope(shield=True):
                await world.record_wait(store, str(waiter), job.id, started=False)


async def _loop(
    cfg: Config, store: Operations, job: Job, how: Follow, display: Display, engine: bool
) -> tuple[Job, int | None]:
    watcher, output = Watcher(cfg, store), Output()
    deadline = None if how.timeout is None else time.monotonic() + how.timeout
    next_look, delay = 0.0, 0.02
    while True:
        job = await store.get_job(job.id)
        if how.output:
            for stream, data in output.read(await store.attempts(job.id)):
                display.output(stream, data)
        if job.state.terminal:
            display.ended(job)
            return job, 0
        if how.until == "running" and job.state is JobState.RUNNING:
            return job, 0
        if deadline is not None and time.monotonic() >= deadline:
            return job, None
        if time.monotonic() >= next_look and how.mode is not Mode.QUIET:
            next_look = time.monotonic() + LOOK_S
            now = time.time()
            engine = await engine_serving(cfg, store, now)  # started or stopped meanwhile
            display.status(job, why(await watcher.facts(job, now, engine=engine)))
        await anyio.sleep(delay)
        delay = min(delay * 1.5, 0.25)
