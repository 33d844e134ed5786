"""`corral demo`: a real engine process governing a small fleet, shown live to a summary."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from corral.config import load
from corral.core.ports import Store
from corral.domain.errors import WorkerError
from corral.domain.governance import KillSwitch, ScopeKind
from corral.domain.ids import new_id
from corral.domain.models import Job, JobSpec, Limits
from corral.domain.states import JobState
from corral.runtime.assembly import build_store
from corral.runtime.control import poke
from corral.services.submissions import Submissions, submissions

from .views import styled

DEMO_CONFIG = """\
# Written by `corral demo`: short backoffs so retries are visible within seconds.
scheduler:
  poll_interval_s: 0.5
roles:
  default:
    concurrency: 4
    retry: {base_s: 0.3, cap_s: 2}
  build:
    description: compile and test steps
    concurrency: 2
  notebook:
    description: the NotebookAgent role (its shipped guardrails apply to every job)
environments:
  local:
    max_inflight: 4
"""


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    spec: JobSpec
    expect: JobState
    story: str


def fleet(workdir: str) -> list[Entry]:
    def spec(*argv: str, **kw: object) -> JobSpec:
        return JobSpec(command=argv, cwd=workdir, **kw)  # type: ignore[arg-type]

    return [
        Entry("hello", spec("echo", "hello from corral"), JobState.SUCCEEDED, "runs and succeeds"),
        Entry(
            "compile",
            spec("sh", "-c", "sleep 1; echo compiled", role="build"),
            JobState.SUCCEEDED,
            "a build step",
        ),
        Entry(
            "test",
            spec("sh", "-c", "echo tests pass", role="build"),
            JobState.SUCCEEDED,
            "--after compile: waits for it",
        ),
        Entry(
            "flaky",
            spec(
                "sh",
                "-c",
                "echo 'upstream 503' >&2; exit 3",
                limits=Limits(max_attempts=3, timeout_s=60),
            ),
            JobState.DEAD_LETTERED,
            "fails, retried with backoff, dead-lettered",
        ),
        Entry(
            "hang",
            spec("sleep", "600", limits=Limits(timeout_s=1.5, grace_s=1)),
            JobState.TIMED_OUT,
            "outlives its deadline: tree stopped",
        ),
        Entry("cancel-me", spec("sleep", "600"), JobState.CANCELLED, "cancelled by the operator"),
        Entry(
            "report",
            spec("sh", "-c", "sleep 1.5; echo report", key="nightly-report"),
            JobState.SUCCEEDED,
            "holds idempotency key nightly-report",
        ),
        Entry(
            "report again",
            spec("sh", "-c", "sleep 1.5; echo report", key="nightly-report"),
            JobState.SUCCEEDED,
            "same key: coalesced into the first",
        ),
        Entry(
            "leaves a child",
            spec("sh", "-c", "setsid sleep 300 & echo forked; exit 0"),
            JobState.SUCCEEDED,
            "its setsid child is killed with it",
        ),
        Entry(
            "delete pods",
            spec("kubectl", "delete", "pod", "trainer-0", role="notebook"),
            JobState.DENIED,
            "a guardrail refuses it before it runs",
        ),
        Entry(
            "runaway",
            spec("sleep", "600", tenant="sandbox"),
            JobState.KILLED,
            "kill switch on tenant sandbox",
        ),
    ]


def _start_engine(data_dir: Path, config: Path) -> subprocess.Popen[bytes]:
    log = (data_dir / "engine.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--data-dir",
            str(data_dir),
            "--config",
            str(config),
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while poke(data_dir, "ping") is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = (data_dir / "engine.log").read_text(errors="replace")[-2000:]
            raise WorkerError(f"the demo engine did not start:\n{tail}")
        time.sleep(0.05)
    return proc


def _table(entries: list[Entry], jobs: dict[str, Job], elapsed: float) -> Table:
    table = Table(title=f"corral demo — {elapsed:4.1f}s", show_edge=False)
    for col in ("job", "id", "state", "tries", "what happens", "last error"):
        table.add_column(col)
    for e in entries:
        j = jobs.get(e.name)
        if j is None:
            table.add_row(e.name, "-", "-", "-", e.story, "")
            continue
        table.add_row(
            e.name,
            j.id[-8:],
            styled(j.state),
            f"{j.attempts}/{j.limits.max_attempts}",
            e.story,
            j.last_error or "",
        )
    return table


async def _drive(
    store: Store, cfg_dir: Path, entries: list[Entry], console: Console, ids: dict[str, str]
) -> bool:
    """Submit the fleet (its ids go into `ids`), show it live until every job ended, check."""
    cfg = load(data_dir=cfg_dir, config_path=cfg_dir / "corral.yaml")
    svc = submissions(store, cfg)
    for e in entries:
        after = (ids["compile"],) if e.name == "test" else ()
        spec = replace(e.spec, after=after)
        ids[e.name] = (await svc.submit(spec)).job.id
        poke(cfg_dir)
    start = time.monotonic()
    pending = {"cancel-me", "runaway"}  # the operator's acts, each once its job runs
    with Live(console=console, refresh_per_second=8, transient=False) as live:
        while True:
            jobs = {name: await store.get_job(i) for name, i in ids.items()}
            live.update(_table(entries, jobs, time.monotonic() - start))
            for name in [n for n in pending if jobs[n].state is JobState.RUNNING]:
                pending.discard(name)
                await _operator(store, svc, name, ids[name])
                poke(cfg_dir)
            if all(j.state.terminal for j in jobs.values()):
                break
            await anyio.sleep(0.15)
    ok = all(jobs[e.name].state is e.expect for e in entries)
    coalesced = ids["report"] == ids["report again"]
    console.print()
    console.print(
        f"  {len(entries)} submissions, {len(set(ids.values()))} jobs "
        f"(the duplicate was {'coalesced' if coalesced else 'NOT coalesced'})."
    )
    for e in entries:
        got = jobs[e.name].state
        mark = "[green]✓[/green]" if got is e.expect else "[red]✗[/red]"
        console.print(f"  {mark} {e.name:<16} {styled(got)}  (expected {e.expect.value})")
    # reports and incidents are written as jobs end; the engine may still be writing the last
    audit = await store.verify_audit()
    console.print(
        f"  {'[green]✓[/green]' if audit.ok else '[red]✗[/red]'} audit: "
        f"{audit.checked} append-only records, chain "
        f"{'intact' if audit.ok else 'BROKEN'}"
    )
    return ok and coalesced and audit.ok


async def _operator(store: Store, svc: Submissions, name: str, job_id: str) -> None:
    """What the demo's operator does to a running job: cancel it, or kill its tenant."""
    if name == "cancel-me":
        await svc.cancel(job_id, "cancelled by the demo operator")
        return
    await store.activate_kill_switch(
        KillSwitch(
            id=new_id(),
            scope=ScopeKind.TENANT,
            target="sandbox",
            reason="the demo operator stops a runaway tenant",
            created_at=time.time(),
            created_by="corral demo",
        )
    )


class Demo:
    """One demo run: its data directory, its engine process and the ids of its jobs."""

    def __init__(self, console: Console, ddir: Path) -> None:
        self.console = console
        self.ddir = ddir
        self.engine: subprocess.Popen[bytes] | None = None
        self.ids: dict[str, str] = {}

    def run(self) -> bool:
        """Start the engine, govern the fleet to its end; whether every job ended as expected."""
        ddir = self.ddir
        ddir.mkdir(parents=True, exist_ok=True)
        (ddir / "corral.yaml").write_text(DEMO_CONFIG)
        work = ddir / "work"
        work.mkdir(exist_ok=True)
        self.console.print(f"[bold]corral demo[/bold]: engine on {ddir} (SQLite, embedded default)")
        self.engine = _start_engine(ddir, ddir / "corral.yaml")
        store = build_store(load(data_dir=ddir, config_path=ddir / "corral.yaml"))

        async def main() -> bool:
            await store.open()
            try:
                return await _drive(store, ddir, fleet(str(work)), self.console, self.ids)
            finally:
                await store.close()

        return anyio.run(main)

    def stop(self) -> bool:
        """Stop the engine (every job ended: nothing is left to re-adopt); whether it exited."""
        if self.engine is None:
            return True
        self.engine.send_signal(signal.SIGTERM)
        try:
            self.engine.wait(timeout=10)
            return True
        except subprocess.TimeoutExpired:
            self.engine.kill()
            self.engine.wait()
            return False

    def hints(self) -> None:
        if {"flaky", "delete pods"} <= self.ids.keys():
            d = self.ddir
            self.console.print(
                f"\n  inspect: corral jobs --data-dir {d}   |   "
                f"corral show {self.ids['flaky']} --data-dir {d}"
            )
            self.console.print(
                f"           corral trace {self.ids['delete pods']} --data-dir "
                f"{d}   |   corral incidents --data-dir {d}"
            )


def run_demo(data_dir: Path | None, *, keep: bool = False) -> int:
    """Run the demo. A temporary data directory is removed afterwards, unless `keep` or the
    demo went wrong (then it stays, for inspection); a given `data_dir` is always kept."""
    console = Console(highlight=False)
    temporary = data_dir is None
    demo = Demo(console, (data_dir or Path(tempfile.mkdtemp(prefix="corral-demo-"))).resolve())
    ok = False
    try:
        ok = demo.run()
    finally:
        stopped = demo.stop()
        kept = not temporary or keep or not ok or not stopped
        if not kept:
            shutil.rmtree(demo.ddir, ignore_errors=True)
    if kept:
        demo.hints()
    console.print(
        "[green]demo finished: every job ended as governed[/green]"
        if ok
        else f"[red]demo: some jobs did not end as expected; see {demo.ddir}[/red]"
    )
    if kept and temporary and ok:
        console.print(f"  (kept {demo.ddir} for inspection: remove it when done)")
    return 0 if ok else 1
