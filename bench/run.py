"""Corral against a bare asyncio + SQLite loop doing the same work.

    .venv/bin/python bench/run.py [--quick] [--only W1,W2,W3] [--out bench/results/latest.json]

Each workload runs in this session through the bare loop (insert a QUEUED row, spawn the process
under a semaphore, wait, write the exit code) and through Corral (jobs submitted through the
CLI's code path to an engine in its own process, by default). It prints a table with the ratios
and writes a JSON summary. bench/README.md describes the method and its caveats.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as dt
import json
import os
import platform
import pstats
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import scenarios  # bench/scenarios.py: LAT, Q100K, CLI (bench/ is this script's directory)

import corral
from corral import __version__
from corral.config import Config, load
from corral.core.ports import JobQuery, Store
from corral.domain.models import Job, JobSpec
from corral.domain.states import JobState
from corral.runtime.assembly import build_store
from corral.runtime.control import poke, tell
from corral.runtime.engine import Engine
from corral.services.submissions import submissions

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "latest.json"
POKE_EVERY_S = 0.05  # "coalesced" pokes: at most one per this interval while submitting
POLL_S = 0.02  # how often the benchmark looks at the store for the last durable result
READY_TIMEOUT_S = 30.0
STALL_S = 30.0  # give up on a run when no job ended for this long
QUICK_STALL_S = 20.0  # --quick (the suite's smoke run): a loaded machine starts engines slowly
STRAY_GRACE_S = 3.0  # how long the engine's children may outlive it before we call them strays
W1_TARGET = 0.8
SCENARIOS = ("LAT", "Q100K", "CLI", "H100K")  # bench/scenarios.py, after the workloads
DEFAULT_ONLY = ("W1", "W2", "W3", *SCENARIOS)
MODES = ("live", "drain", "inprocess")
CORES = ("default", "process", "inline")
# The variables a Corral job starts with (corral.workers.command.BASE_ENV_KEYS); the bare loop
# gives its processes the same ones.
JOB_ENV_KEYS = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TERM",
)
UNSET = ("CORRAL_STORE_URL", "CORRAL_CONFIG", "CORRAL_DATA_DIR")


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    jobs: int
    concurrency: int
    what: str
    argv: Callable[[Path], tuple[str, ...]]  # the command, given the run's work directory
    crash: bool = False
    kill_after_s: float = 1.0


def _true(_: Path) -> tuple[str, ...]:
    return ("/bin/true",)


def _echo(_: Path) -> tuple[str, ...]:
    return ("echo", "one line of output")


def _sleep(_: Path) -> tuple[str, ...]:
    return ("sleep", "0.05")


def _record(work: Path) -> tuple[str, ...]:
    """Sleep, then append the job's id to runs.txt: a second complete run shows up twice."""
    return ("sh", "-c", f'sleep 0.2; echo "$CORRAL_JOB_ID" >> {work / "runs.txt"}')


def workloads(quick: bool) -> list[Workload]:
    scale = 10 if quick else 1
    return [
        Workload("W1", 2000 // scale, 8, "/bin/true", _true),
        Workload("W2", 200 // scale, 16, "sleep 0.05", _sleep),
        Workload(
            "W3",
            200 // scale,
            8,
            "sleep 0.2; echo id >> runs.txt; engine SIGKILLed",
            _record,
            crash=True,
            kill_after_s=0.3 if quick else 1.0,
        ),
        # W1 with one line on stdout: every job's output goes through the output pump
        Workload("W4", 1000 // scale, 8, "echo one line of output", _echo),
    ]


@dataclass(frozen=True, slots=True)
class Options:
    mode: str = "live"  # how Corral runs W1/W2 (see --mode)
    poke: str = "coalesced"
    core: str = "default"
    profile: Path | None = None
    stall_s: float = STALL_S


# --------------------------------------------------------------------------- results


@dataclass(slots=True)
class RunStats:
    """One system's run of one workload."""

    jobs: int
    elapsed_s: float
    latencies_s: list[float]
    failed: int = 0  # jobs that did not end SUCCEEDED (or with exit code 0, for the bare loop)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def jobs_per_s(self) -> float:
        """Jobs that succeeded per second (a run that left jobs behind scores only the rest)."""
        return (self.jobs - self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in [0, 100])."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# --------------------------------------------------------------------------- processes


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat fields after the command name (field 3 onwards), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            children.setdefault(int(st[1]), []).append(int(name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds of a live process tree: the root's own, its live descendants' own (a core
    child), and everything reaped inside the tree (shims and jobs)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"engine": 0.0, "core": 0.0, "shims_and_jobs": 0.0}
    for pid in [root, *descendants(root)]:
        st = _stat(pid)
        if st is None:
            continue
        utime, stime, cutime, cstime = (int(x) / tick for x in st[11:15])
        out["engine" if pid == root else "core"] += utime + stime
        out["shims_and_jobs"] += cutime + cstime
    return {k: round(v, 2) for k, v in out.items()}


def strays(marker: str) -> list[int]:
    """Processes still alive whose command line names `marker` (our work directory)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and (_stat(int(name)) or ["Z"])[0] != "Z":
            found.append(int(name))
    return found


def reap_strays(marker: str) -> list[str]:
    """End (by pid) the processes this run left behind; their command lines."""
    found = []
    for pid in strays(marker):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
        found.append(cmd.strip()[:200])
    return found


# --------------------------------------------------------------------------- the bare loop


def job_env(job_id: str) -> dict[str, str]:
    """What Corral gives a job: a few of our variables plus CORRAL_JOB_ID."""
    env = {k: os.environ[k] for k in JOB_ENV_KEYS if k in os.environ}
    env["CORRAL_JOB_ID"] = job_id
    env["CORRAL_ATTEMPT"] = "1"
    return env


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


async def _bare(n: int, concurrency: int, argv: tuple[str, ...], work: Path) -> RunStats:
    db = sqlite3.connect(work / "bare.db", isolation_level=None)  # autocommit: one commit each
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, command TEXT NOT NULL,"
        " created_at REAL NOT NULL, updated_at REAL NOT NULL, exit_code INTEGER)"
    )
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failed = 0
    command = json.dumps(list(argv))

    async def one(i: int) -> None:
        nonlocal failed
        job_id, created = f"bare-{i:06d}", time.time()
        db.execute(
            "INSERT INTO jobs (id, state, command, created_at, updated_at)"
            " VALUES (?, 'QUEUED', ?, ?, ?)",
            (job_id, command, created, created),
        )
        async with sem:
            jdir = work / "jobs" / job_id
            jdir.mkdir(parents=True)
            with open(jdir / "stdout.log", "ab") as out, open(jdir / "stderr.log", "ab") as err:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=work,
                    env=job_env(job_id),
                )
            code = await proc.wait()
            db.execute(
                "UPDATE jobs SET state = ?, exit_code = ?, updated_at = ? WHERE id = ?",
                ("SUCCEEDED" if code == 0 else "FAILED", code, time.time(), job_id),
            )
            failed += code != 0
            latencies.append(time.time() - created)

    t0, cpu0, kids0 = time.time(), time.process_time(), _children_cpu()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.time() - t0
    db.close()
    cpu = {"loop": round(time.process_time() - cpu0, 2), "jobs": round(_children_cpu() - kids0, 2)}
    return RunStats(
        jobs=n, elapsed_s=elapsed, latencies_s=latencies, failed=failed, extra={"cpu_s": cpu}
    )


def run_bare(wl: Workload, work: Path) -> RunStats:
    work.mkdir(parents=True)
    return asyncio.run(_bare(wl.jobs, wl.concurrency, wl.argv(work), work))


# --------------------------------------------------------------------------- Corral


def write_config(data: Path, concurrency: int, core: str) -> Config:
    data.mkdir(parents=True)
    path = data / "corral.yaml"
    text = (
        "roles:\n"
        "  default:\n"
        f"    concurrency: {concurrency}\n"
        "    retry:\n"
        "      base_s: 0.05\n"
        "environments:\n"
        "  local:\n"
        f"    max_inflight: {concurrency}\n"
    )
    if core != "default":
        text += f"core:\n  mode: {core}\n"
    path.write_text(text)
    return load(data_dir=data, config_path=path)


class EngineProcess:
    """`python -m corral serve` on the benchmark's data directory, in its own process."""

    def __init__(self, cfg: Config, *, drain: bool, tag: str, stall_s: float = STALL_S) -> None:
        assert cfg.source is not None
        self.cfg = cfg
        self.stall_s = stall_s
        self.log = cfg.data_dir / f"engine-{tag}.log"
        argv = [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--no-http",
            "--data-dir",
            str(cfg.data_dir),
            "--config",
            str(cfg.source),
        ]
        if drain:
            argv.append("--drain")
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        self.started_at = time.time()

    def signalled(self) -> bool:
        """Whether the engine logged a SIGTERM/SIGINT (from anyone: we only ever SIGTERM a
        live engine once its jobs are done, so for a drain engine it means interference)."""
        text = self.log.read_text(errors="replace")
        return "received SIGTERM" in text or "received SIGINT" in text

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self) -> float:
        """Block until the engine answers on its control socket; seconds it took."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited early ({self.proc.returncode}):\n{self.tail()}")
            answer = poke(self.cfg.data_dir, "ping")
            if answer and answer.get("ok"):
                return time.time() - self.started_at
            time.sleep(0.01)
        raise RuntimeError(f"engine not ready after {READY_TIMEOUT_S}s:\n{self.tail()}")

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"engine did not exit within {timeout}s:\n{self.tail()}") from None

    def wait_drained(self) -> int:
        """Wait for a `--drain` engine to exit; kill it (exit code -9) when no job ended for
        stall_s seconds."""
        last, progress_at = -1, time.monotonic()
        while (rc := self.proc.poll()) is None:
            ended = _ended(self.cfg.db_path)
            now = time.monotonic()
            if ended != last:
                last, progress_at = ended, now
            elif now - progress_at > self.stall_s:
                print(
                    f"  drain engine stalled ({ended} jobs ended); killing it\n{self.tail()}",
                    file=sys.stderr,
                )
                self.kill()
                return -9
            time.sleep(0.1)
        return rc

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(30.0)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass(slots=True)
class Submitter:
    """Submits through the CLI's code path (`submissions(store, cfg).submit` + `tell`)."""

    cfg: Config
    store: Store
    poke_mode: str  # "each" (what `corral submit` does per job), "coalesced" or "none"
    _last_poke: float = 0.0

    async def submit_all(self, specs: Sequence[JobSpec]) -> list[str]:
        svc = submissions(self.store, self.cfg)
        ids: list[str] = []
        for spec in specs:
            ids.append((await svc.submit(spec)).job.id)
            self._maybe_poke(final=False)
        self._maybe_poke(final=True)
        return ids

    def _maybe_poke(self, *, final: bool) -> None:
        if self.poke_mode == "none":
            return
        now = time.monotonic()
        if final or self.poke_mode == "each" or now - self._last_poke >= POKE_EVERY_S:
            tell(self.cfg.data_dir, "submitted")
            self._last_poke = now


async def _submit(
    cfg: Config,
    specs: Sequence[JobSpec],
    poke_mode: str,
    engine: EngineProcess | None = None,
    ended_before: int = 0,
) -> float:
    """Open one store, submit every spec and, given a serving engine, wait until every job
    ended (or the engine stalls or exits; `ended_before`: the store's ended jobs before the
    submissions). Returns the time of the first submission."""
    store = build_store(cfg)
    await store.open()
    try:
        t0 = time.time()
        await Submitter(cfg, store, poke_mode).submit_all(specs)
        if engine is not None:
            why = await _wait_terminal(store, ended_before + len(specs), engine)
            if why:
                print(f"  gave up waiting: {why}\n{engine.tail()}", file=sys.stderr)
        return t0
    finally:
        await store.close()


async def _wait_terminal(store: Store, n: int, engine: EngineProcess) -> str | None:
    """None once n jobs ended; else why we stopped waiting (no progress, engine gone)."""
    terminal = {s.value for s in JobState if s.terminal}
    last, progress_at = -1, time.monotonic()
    while True:
        counts = await store.counts()
        ended = sum(v for k, v in counts.items() if k in terminal)
        if ended >= n:
            return None
        now = time.monotonic()
        if ended != last:
            last, progress_at = ended, now
        elif now - progress_at > engine.stall_s:
            return f"no job ended for {engine.stall_s:.0f}s ({ended}/{n} ended, states {counts})"
        if engine.proc.poll() is not None:
            return f"the engine exited with {engine.proc.returncode} ({ended}/{n} ended)"
        await anyio.sleep(POLL_S)


def _ended(db: Path) -> int:
    terminal = sorted(s.value for s in JobState if s.terminal)
    marks = ", ".join("?" * len(terminal))
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        row = conn.execute(
            f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})", terminal
        ).fetchone()
    return int(row[0])


async def _final_jobs(cfg: Config, n: int) -> list[Job]:
    store = build_store(cfg)
    await store.open()
    try:
        return await store.list_jobs(JobQuery(limit=n + 1000))
    finally:
        await store.close()


def _stats(jobs: list[Job], n: int, t0: float) -> RunStats:
    ok = [j for j in jobs if j.state is JobState.SUCCEEDED]
    end = max((j.updated_at for j in jobs if j.state.terminal), default=time.time())
    return RunStats(
        jobs=n,
        elapsed_s=end - t0,
        latencies_s=[j.updated_at - j.created_at for j in ok],
        failed=n - len(ok),
        extra={
            "states": dict(Counter(j.state.value for j in jobs)),
            "retried": sum(1 for j in jobs if j.attempts > 1),
            "end_at": end,
        },
    )


def _specs(wl: Workload, work: Path) -> list[JobSpec]:
    argv = wl.argv(work)
    return [JobSpec(command=argv, cwd=str(work)) for _ in range(wl.jobs)]


def run_corral_live(wl: Workload, work: Path, opts: Options) -> RunStats:
    """Engine already serving (its start is not timed); jobs submitted while it runs."""
    cfg = write_config(work / "data", wl.concurrency, opts.core)
    specs = _specs(wl, work)
    engine = EngineProcess(cfg, drain=False, tag="live", stall_s=opts.stall_s)
    try:
        ready_s = engine.wait_ready()
        at_ready = tree_cpu(engine.proc.pid)  # the engine's start is not the jobs' cost
        cpu0 = time.process_time()
        t0 = anyio.run(_submit, cfg, specs, opts.poke, engine)
        submitter_cpu = time.process_time() - cpu0
        cpu = {
            k: round(max(0.0, v - at_ready.get(k, 0.0)), 2)
            for k, v in tree_cpu(engine.proc.pid).items()
        }
        early = engine.proc.poll()  # not None: it exited before we stopped it
        interfered = engine.signalled()  # a signal before ours
        rc = engine.stop()
    finally:
        engine.kill()
    stats = _stats(anyio.run(_final_jobs, cfg, wl.jobs), wl.jobs, t0)
    stats.extra.update(
        engine_ready_s=round(ready_s, 3),
        engine_rc=rc,
        cpu_s={**cpu, "submitter": round(submitter_cpu, 2)},
    )
    if interfered:
        stats.extra["interference"] = "the engine received a signal we did not send"
    elif early is not None:
        stats.extra["restart_log"] = f"engine exited early with {early}:\n{engine.tail()}"
    return stats


def run_corral_drain(wl: Workload, work: Path, opts: Options) -> RunStats:
    """Submit everything, then `corral serve --drain` (engine startup is inside the timing)."""
    cfg = write_config(work / "data", wl.concurrency, opts.core)
    t0 = anyio.run(_submit, cfg, _specs(wl, work), "none")
    engine = EngineProcess(cfg, drain=True, tag="drain", stall_s=opts.stall_s)
    try:
        rc = engine.wait_drained()
    finally:
        engine.kill()
    stats = _stats(anyio.run(_final_jobs, cfg, wl.jobs), wl.jobs, t0)
    stats.extra.update(engine_rc=rc)
    if engine.signalled():
        stats.extra["interference"] = "the drain engine received a signal we did not send"
    return stats


def run_corral_inprocess(wl: Workload, work: Path, opts: Options) -> RunStats:
    """Submit everything, then `Engine(cfg).run(drain=True)` in this process (for profiling)."""
    cfg = write_config(work / "data", wl.concurrency, opts.core)
    t0 = anyio.run(_submit, cfg, _specs(wl, work), "none")
    engine = Engine(cfg)
    prof = cProfile.Profile() if opts.profile else None
    t_engine = time.time()
    if prof is not None:
        prof.enable()
    anyio.run(lambda: engine.run(drain=True))
    if prof is not None and opts.profile is not None:
        prof.disable()
        out = opts.profile / f"{wl.name}.pstats"
        out.parent.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(out))
    stats = _stats(anyio.run(_final_jobs, cfg, wl.jobs), wl.jobs, t0)
    stats.extra.update(engine_only_s=round(stats.extra["end_at"] - t_engine, 3))
    return stats


def run_corral_crash(wl: Workload, work: Path, opts: Options) -> RunStats:
    """W3: serve, submit, SIGKILL the engine kill_after_s after the first submission, then
    `serve --drain` on the same data directory until it exits."""
    cfg = write_config(work / "data", wl.concurrency, opts.core)
    first = EngineProcess(cfg, drain=False, tag="first", stall_s=opts.stall_s)
    try:
        first.wait_ready()
        t0 = anyio.run(_submit, cfg, _specs(wl, work), opts.poke)
        time.sleep(max(0.0, t0 + wl.kill_after_s - time.time()))
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
    finally:
        first.kill()
    at_kill = Counter(j.state.value for j in anyio.run(_final_jobs, cfg, wl.jobs))
    restart_at = time.time()
    second = EngineProcess(cfg, drain=True, tag="restart", stall_s=opts.stall_s)
    try:
        rc = second.wait_drained()
    finally:
        second.kill()
    jobs = anyio.run(_final_jobs, cfg, wl.jobs)
    stats = _stats(jobs, wl.jobs, t0)
    runs_file = work / "runs.txt"
    runs = Counter(runs_file.read_text().split()) if runs_file.exists() else Counter()
    ok_ids = {j.id for j in jobs if j.state is JobState.SUCCEEDED}
    stats.extra.update(
        lost=stats.failed,
        duplicated=sum(1 for c in runs.values() if c > 1),
        succeeded_without_run=len(ok_ids - set(runs)),
        recovery_s=round(stats.extra["end_at"] - restart_at, 3),
        at_kill=dict(at_kill),
        restart_rc=rc,
        recovered_events=_count_events(cfg.db_path, "recovered"),
    )
    if rc != 0 or stats.failed:
        stats.extra["restart_log"] = second.tail()
    if second.signalled():
        stats.extra["interference"] = "the restarted engine received a signal we did not send"
    return stats


def phases(db: Path, concurrency: int, elapsed_s: float) -> dict[str, Any] | None:
    """Where a succeeded job's time went (medians, ms): queued (submitted -> claimed), start
    (claimed -> recorded RUNNING), run (RUNNING -> process ended, by the shim's clock), finish
    (process ended -> job durable); and how busy the slots were (sum of runs / C x elapsed)."""
    sql = (
        "SELECT j.created_at, a.created_at, a.started_at, a.ended_at, j.updated_at"
        " FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.idx = j.attempts"
        " WHERE j.state = 'SUCCEEDED'"
    )
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
            rows = [r for r in conn.execute(sql).fetchall() if None not in r]
    except sqlite3.Error:
        return None  # another schema: skip the breakdown
    if not rows:
        return None
    cols = {"queued": (0, 1), "start": (1, 2), "run": (2, 3), "finish": (3, 4)}
    out: dict[str, Any] = {
        name: round(percentile([r[b] - r[a] for r in rows], 50) * 1000, 1)
        for name, (a, b) in cols.items()
    }
    busy = sum(r[3] - r[2] for r in rows)
    out["slot_utilization"] = round(busy / (concurrency * elapsed_s), 3) if elapsed_s else None
    return out


def _count_events(db: Path, kind: str) -> int:
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        row = conn.execute("SELECT COUNT(*) FROM job_events WHERE kind = ?", (kind,)).fetchone()
    return int(row[0])


def run_corral(wl: Workload, work: Path, opts: Options) -> RunStats:
    work.mkdir(parents=True)
    runner = {
        "drain": run_corral_drain,
        "inprocess": run_corral_inprocess,
        "live": run_corral_live,
    }[opts.mode]
    stats = (run_corral_crash if wl.crash else runner)(wl, work, opts)
    stats.extra["phases_ms"] = phases(work / "data" / "corral.db", wl.concurrency, stats.elapsed_s)
    deadline = time.monotonic() + STRAY_GRACE_S  # let exiting children go first
    while strays(str(work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = reap_strays(str(work))
    if left:
        stats.extra["stray_processes"] = len(left)
        stats.extra["stray_cmdlines"] = left
    return stats


# --------------------------------------------------------------------------- reporting


def _git(*args: str) -> str | None:
    """Read-only git queries about the checkout the benchmark ran from."""
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=BENCH_DIR.parent,
            capture_output=True,
            text=True,
            check=False,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    src = Path(corral.__file__).resolve().parent
    checkout = BENCH_DIR.parent
    ours = src.is_relative_to(checkout)  # else corral came from elsewhere (e.g. PYTHONPATH)
    dirty = _git("status", "--porcelain", "--", "src") if ours else None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "corral": __version__,
        "corral_src": str(src),  # the code that was measured
        "commit": _git("rev-parse", "--short", "HEAD") if ours else None,
        "src_modified": bool(dirty) if dirty is not None else None,  # uncommitted changes
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def summarize(wl: Workload, corral: RunStats, bare: RunStats) -> dict[str, Any]:
    ratio = corral.jobs_per_s / bare.jobs_per_s if bare.jobs_per_s else 0.0
    valid = corral.failed == 0 and bare.failed == 0
    row: dict[str, Any] = {
        "valid": valid,  # every job of both runs succeeded: the ratio compares like with like
        "jobs": wl.jobs,
        "concurrency": wl.concurrency,
        "command": wl.what,
        "jobs_per_s": round(corral.jobs_per_s, 1),
        "baseline_jobs_per_s": round(bare.jobs_per_s, 1),
        "ratio": round(ratio, 3),
        "p50_ms": round(percentile(corral.latencies_s, 50) * 1000, 1),
        "p99_ms": round(percentile(corral.latencies_s, 99) * 1000, 1),
        "baseline_p50_ms": round(percentile(bare.latencies_s, 50) * 1000, 1),
        "baseline_p99_ms": round(percentile(bare.latencies_s, 99) * 1000, 1),
        "elapsed_s": round(corral.elapsed_s, 3),
        "baseline_elapsed_s": round(bare.elapsed_s, 3),
        "not_succeeded": corral.failed,
        "baseline_failed": bare.failed,
        "retried": corral.extra.get("retried", 0),
        "states": corral.extra.get("states", {}),
        "baseline_cpu_s": bare.extra.get("cpu_s"),
    }
    split = scenarios.cpu_split_ms(corral.extra.get("cpu_s"), bare.extra.get("cpu_s"), wl.jobs)
    if split is not None:
        row["cpu_ms_per_job"] = split
    for key in (
        "cpu_s",
        "phases_ms",
        "lost",
        "duplicated",
        "recovery_s",
        "succeeded_without_run",
        "at_kill",
        "recovered_events",
        "restart_rc",
        "restart_log",
        "engine_ready_s",
        "engine_only_s",
        "stray_processes",
        "stray_cmdlines",
        "interference",
    ):
        if key in corral.extra:
            row[key] = corral.extra[key]
    if wl.name == "W1":
        row["target_ratio"] = W1_TARGET
        row["meets_target"] = valid and ratio >= W1_TARGET
    return row


def _notes(r: dict[str, Any]) -> str:
    notes = [f"{r['retried']} retried"] if r["retried"] else []
    if "lost" in r:
        notes += [
            f"lost {r['lost']}",
            f"duplicated {r['duplicated']}",
            f"recovery {r['recovery_s']:.2f}s",
        ]
    elif r["not_succeeded"]:
        notes.append(f"NOT SUCCEEDED {r['not_succeeded']} {r['states']}")
    if r.get("stray_processes"):
        notes.append(f"{r['stray_processes']} stray processes")
    if r.get("interference"):
        notes.append("INTERFERENCE: " + r["interference"])
    if "meets_target" in r:
        notes.append(("meets" if r["meets_target"] else "BELOW") + f" {W1_TARGET}x target")
    return ", ".join(notes)


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'wl':<3} {'jobs':>5} {'C':>3} {'corral/s':>9} {'bare/s':>8} {'ratio':>6} "
        f"{'p50 ms':>13} {'p99 ms':>13}  notes"
    )
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        p50 = f"{r['p50_ms']:.0f}/{r['baseline_p50_ms']:.0f}"
        p99 = f"{r['p99_ms']:.0f}/{r['baseline_p99_ms']:.0f}"
        ratio = f"{r['ratio']:.2f}" + ("" if r["valid"] else "!")
        print(
            f"{name:<3} {r['jobs']:>5} {r['concurrency']:>3} {r['jobs_per_s']:>9.1f} "
            f"{r['baseline_jobs_per_s']:>8.1f} {ratio:>6} {p50:>13} {p99:>13}  " + _notes(r)
        )
    print(
        "(jobs/s count succeeded jobs; ! = some jobs did not succeed, the ratio is not "
        "comparable)\n(p50/p99 ms: corral/bare, per job from submission to durable result)"
    )
    for name, r in rows.items():
        if c := r.get("cpu_ms_per_job"):
            print(
                f"CPU ms per job {name}: engine {c['engine']:.2f} + core {c['core']:.2f} + "
                f"shim {c['shim']:.2f} + job {c['job']:.2f} = {c['corral_total']:.2f} "
                f"(submitter {c['submitter']:.2f}); bare loop {c['bare_loop']:.2f} + job "
                f"{c['bare_job']:.2f} = {c['bare_total']:.2f}"
            )


def _engine_starter(cfg: Config) -> EngineProcess:
    return EngineProcess(cfg, drain=False, tag="scenario")


def run_scenarios(only: Sequence[str], root: Path, quick: bool) -> dict[str, Any]:
    """LAT, Q100K and CLI (bench/scenarios.py), each with its baseline in this run."""
    out: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    if "LAT" in only:
        n = 10 if quick else 50
        print(f"LAT: {n} x submit one `{' '.join(scenarios.LAT_COMMAND)}` to an idle engine")
        work = root / "LAT"
        cfg = write_config(work / "data", 8, "default")
        out["LAT"] = scenarios.run_latency(work, n, _engine_starter, cfg, job_env("lat"))
    if "Q100K" in only:
        big = 10_000 if quick else 100_000
        print(f"Q100K: 100 and {big:,} jobs queued")
        runs = []
        for n in (100, big):
            work = root / "Q100K" / str(n)
            cfg = write_config(work / "data", 8, "default")
            runs.append(scenarios.run_queued_one(work, n, cfg, _engine_starter, descendants, env))
            print(f"  {n:>7} queued: {runs[-1]}", flush=True)
        out["Q100K"] = scenarios.summarize_queued(runs[0], runs[1])
    if "H100K" in only:
        big = 10_000 if quick else 100_000
        jobs = 200 if quick else 1000
        print(f"H100K: {jobs} x /bin/true on stores holding 100 and {big:,} ended jobs")
        runs = []
        for n, analyze in ((100, False), (big, False), (big, True)):
            work = root / "H100K" / f"{n}-{'stats' if analyze else 'nostats'}"
            runs.append(run_history_one(work, n, jobs, analyze=analyze))
            print(f"  {runs[-1]}", flush=True)
        small = runs[0]
        out["H100K"] = {
            "runs": runs,
            "engine_ms_per_job_ratio": [
                round(r["engine_ms_per_job"] / small["engine_ms_per_job"], 2) for r in runs[1:]
            ],
            "rate_ratio": [round(r["jobs_per_s"] / small["jobs_per_s"], 2) for r in runs[1:]],
        }
    if "CLI" in only:
        runs_cli = 5 if quick else 15
        print(f"CLI: {runs_cli} x `corral jobs --json` on an empty store")
        out["CLI"] = scenarios.run_cli(root / "CLI", runs_cli, env)
    return out


def run_history_one(work: Path, history: int, n: int, *, analyze: bool) -> dict[str, Any]:
    """n x /bin/true at concurrency 8 through a live engine whose store already holds `history`
    ended, reported jobs: the rate and the engine's CPU per job (its start not counted)."""
    cfg = write_config(work / "data", 8, "default")
    anyio.run(scenarios._migrate, cfg.db_path)
    t0 = time.perf_counter()
    scenarios.fill_history(cfg.db_path, history, analyze=analyze)
    filled_s = time.perf_counter() - t0
    specs = [JobSpec(command=["/bin/true"], cwd=str(work)) for _ in range(n)]
    engine = EngineProcess(cfg, drain=False, tag="history")
    try:
        engine.wait_ready()
        at_ready = tree_cpu(engine.proc.pid)
        started = anyio.run(_submit, cfg, specs, "coalesced", engine, history)
        elapsed = time.time() - started
        cpu = tree_cpu(engine.proc.pid)
    finally:
        engine.stop()
    return {
        "history": history,
        "statistics": analyze,
        "fill_s": round(filled_s, 1),
        "jobs": n,
        "jobs_per_s": round(n / elapsed, 1),
        "engine_ms_per_job": round((cpu["engine"] - at_ready["engine"]) * 1000 / n, 2),
        "core_ms_per_job": round((cpu["core"] - at_ready["core"]) * 1000 / n, 2),
    }


def print_scenarios(extra: dict[str, Any]) -> None:
    if lat := extra.get("LAT"):
        print(
            f"\nLAT  submit -> permit p50 {lat['permit_p50_ms']} ms, -> RUNNING p50 "
            f"{lat['running_p50_ms']} / p99 {lat['running_p99_ms']} ms; bare loop p50 "
            f"{lat['baseline_p50_ms']} / p99 {lat['baseline_p99_ms']} ms (ratio "
            f"{lat['ratio_p50']}; target p50 < 5 ms: "
            f"{'meets' if lat['meets_target'] else 'MISSED'})\n"
            f"     submit -> end durable, less the command's run: p50 {lat['ended_p50_ms']} / "
            f"p99 {lat['ended_p99_ms']} ms; bare loop p50 {lat['baseline_ended_p50_ms']} ms"
        )
    if q := extra.get("Q100K"):
        s, b = q["small"], q["big"]
        print(
            f"Q100K {s['queued']} vs {b['queued']:,} queued: claim query p50 "
            f"{s['claim_p50_ms']} / {b['claim_p50_ms']} ms (x{q['claim_ratio_p50']}); "
            f"submission p50 {s['submit_p50_ms']} / {b['submit_p50_ms']} ms "
            f"(x{q['submit_ratio_p50']}); engine "
            f"{s['engine_ms_per_job']} / {b['engine_ms_per_job']} ms per job "
            f"(x{q['engine_ms_per_job_ratio']}); engine RSS {s['engine_rss_mb']} / "
            f"{b['engine_rss_mb']} MB, core {s['core_rss_mb']} / {b['core_rss_mb']} MB; "
            f"`corral jobs --json` {s['cli_jobs_json_p50_s']} / {b['cli_jobs_json_p50_s']} s"
        )
    if h := extra.get("H100K"):
        line = ", ".join(
            f"{r['history']:,} ended{' + ANALYZE' if r['statistics'] else ''}: "
            f"{r['jobs_per_s']} jobs/s, engine {r['engine_ms_per_job']} ms/job"
            for r in h["runs"]
        )
        print(
            f"H100K {line}; engine CPU x{h['engine_ms_per_job_ratio']}, rate "
            f"x{h['rate_ratio']} of the small store's"
        )
    if c := extra.get("CLI"):
        print(
            f"CLI  `corral jobs --json` (empty store) p50 {c['p50_s']} s, p99 {c['p99_s']} s; "
            f"`python -c pass` {c['baseline_p50_s']} s (ratio {c['ratio']}, "
            f"+{c['over_baseline_s']} s); {c['modules_imported']} modules imported; "
            f"target < {c['target_s']} s: {'meets' if c['meets_target'] else 'MISSED'}"
        )
        print(
            f"CLI  `corral show ID --json` with a configuration file p50 "
            f"{c['show_cached_p50_s']} s cached, {c['show_validated_p50_s']} s validated anew "
            f"(ratio {c['show_cached_ratio']})"
        )


def print_hotspots(profile_dir: Path, names: Sequence[str], top: int = 25) -> None:
    for name in names:
        path = profile_dir / f"{name}.pstats"
        if path.exists():
            print(f"\n== cProfile of the in-process engine, {name} (by own time) ==")
            pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Corral vs a bare asyncio + SQLite loop.")
    p.add_argument("--quick", action="store_true", help="~10x fewer jobs (a smoke run)")
    p.add_argument(
        "--only",
        default=",".join(DEFAULT_ONLY),
        help="comma-separated workloads (W1,W2,W3,W4) and scenarios (LAT,Q100K,CLI,H100K)",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON summary to write")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each workload N times per system; report the median run",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="live",
        help="how Corral runs W1/W2: live = engine process already serving while "
        "jobs are submitted (default); drain = submit all, then `serve --drain` "
        "(engine start timed); inprocess = submit all, then "
        "Engine.run(drain=True) in this process. W3 always uses processes.",
    )
    p.add_argument(
        "--poke",
        choices=("coalesced", "each", "none"),
        default="coalesced",
        help="pokes while submitting: at most one per 50 ms (default), or one per "
        "job as `corral submit` does",
    )
    p.add_argument(
        "--core",
        choices=CORES,
        default="default",
        help="write core.mode into corral.yaml (default: leave the engine's default)",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="with --mode inprocess: cProfile the engine, write DIR/<W>.pstats",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    p.add_argument(
        "--label",
        default="",
        help="a note stored in the JSON summary (e.g. which snapshot of corral was measured)",
    )
    args = p.parse_args(argv)
    known = {w.name for w in workloads(False)} | set(SCENARIOS)
    args.only = [w.strip().upper() for w in args.only.split(",") if w.strip()]
    if unknown := set(args.only) - known:
        p.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.profile and args.mode != "inprocess":
        p.error("--profile needs --mode inprocess")
    return args


def _round(corral: RunStats, bare: RunStats) -> dict[str, Any]:
    """One round of a repeated workload: throughputs, plus what went wrong if anything did."""
    out: dict[str, Any] = {
        "jobs_per_s": round(corral.jobs_per_s, 1),
        "baseline_jobs_per_s": round(bare.jobs_per_s, 1),
    }
    if corral.failed:
        out["states"] = corral.extra.get("states")
    for key in (
        "lost",
        "duplicated",
        "recovery_s",
        "at_kill",
        "restart_rc",
        "restart_log",
        "stray_processes",
        "interference",
    ):
        if corral.extra.get(key):
            out[key] = corral.extra[key]
    return out


def _median_run(runs: list[RunStats]) -> RunStats:
    return sorted(runs, key=lambda r: r.jobs_per_s)[(len(runs) - 1) // 2]


def measure(wl: Workload, root: Path, repeat: int, opts: Options) -> dict[str, Any]:
    """Run the bare loop and Corral `repeat` times (alternating which goes first)."""
    bares: list[RunStats] = []
    corrals: list[RunStats] = []
    for r in range(repeat):
        work = root / wl.name / f"round{r}"
        for system in ("bare", "corral") if r % 2 == 0 else ("corral", "bare"):
            if system == "bare":
                bares.append(run_bare(wl, work / "bare"))
            else:
                corrals.append(run_corral(wl, work / "corral", opts))
        print(
            f"  round {r + 1}/{repeat}: corral {corrals[-1].jobs_per_s:.1f} jobs/s, "
            f"bare {bares[-1].jobs_per_s:.1f} jobs/s",
            flush=True,
        )
    row = summarize(wl, _median_run(corrals), _median_run(bares))
    if repeat > 1:
        row["repeats"] = repeat
        row["rounds"] = [_round(c, b) for c, b in zip(corrals, bares, strict=True)]
        row["not_succeeded"] = sum(c.failed for c in corrals)  # over all rounds
        row["valid"] = all(c.failed == 0 for c in corrals) and all(b.failed == 0 for b in bares)
        for key in ("lost", "duplicated", "succeeded_without_run", "stray_processes"):
            if any(key in c.extra for c in corrals):
                row[key] = sum(int(c.extra.get(key, 0)) for c in corrals)
    return row


def _prebuild_shim() -> None:
    """Compile the shim once, outside any timing (the engine would build it on first use)."""
    try:
        from corral.workers.native import shim_path
    except ImportError:
        return
    shim_path()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    opts = Options(
        mode=args.mode,
        poke=args.poke,
        core=args.core,
        profile=Path(args.profile) if args.profile else None,
        stall_s=QUICK_STALL_S if args.quick else STALL_S,
    )
    for name in UNSET:
        os.environ.pop(name, None)
    env = environment()
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    _prebuild_shim()
    root = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    rows: dict[str, dict[str, Any]] = {}
    try:
        for wl in workloads(args.quick):
            if wl.name in args.only:
                print(f"{wl.name}: {wl.jobs} x {wl.what}, concurrency {wl.concurrency}", flush=True)
                rows[wl.name] = measure(wl, root, args.repeat, opts)
        extra = run_scenarios(args.only, root, args.quick)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print()
    if rows:
        print_table(rows)
    print_scenarios(extra)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {
        "environment": env,
        "label": args.label,
        "quick": args.quick,
        "repeat": args.repeat,
        "corral_mode": opts.mode,
        "poke": opts.poke,
        "core": opts.core,
        "workloads": rows,
        "scenarios": extra,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {out}")
    if opts.profile is not None:
        print_hotspots(opts.profile, [n for n in args.only if n != "W3"])
    bad = [
        n
        for n, r in rows.items()
        if r["not_succeeded"] or r.get("duplicated") or r.get("stray_processes")
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
