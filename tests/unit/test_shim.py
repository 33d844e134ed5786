"""corral-shim and its Python side, exercised with real processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.domain.errors import WorkerError
from corral.workers import native, process
from corral.workers.process import (
    ProbeState,
    ShimProcess,
    ShimResult,
    attempt_processes,
    probe,
    read_result,
    spawn,
)
from corral.workers.proctab import alive, descendants, read_stat
from corral.workers.zygote import Zygote
from tests.helpers import eventually

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
Start = Callable[..., ShimProcess]


def wait(proc: ShimProcess, timeout: float = 10.0) -> ShimResult:
    async def main() -> ShimResult:
        with anyio.fail_after(timeout):
            return await proc.wait()

    return anyio.run(main)


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def comm(pid: int) -> str:
    stat = read_stat(pid)
    return stat.comm if stat else ""


@pytest.fixture(params=["exec", "zygote"])
def start(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Start]:
    """spawn() with test defaults, the shim exec'd or forked by a zygote (workers/zygote.py):
    every test here holds for both; whatever is still running at teardown is killed and
    reaped."""
    procs: list[ShimProcess] = []
    counter = iter(range(1000))
    zygote = Zygote() if request.param == "zygote" else None

    def _start(*argv: str, **kw: Any) -> ShimProcess:
        kw.setdefault("attempt_dir", tmp_path / f"attempt-{next(counter)}")
        kw.setdefault("cwd", None)
        kw.setdefault("env", ENV)
        kw.setdefault("grace_s", 5.0)
        kw.setdefault("deadline_epoch_s", None)
        proc = spawn(argv=argv, via=zygote, **kw)
        if zygote is not None:
            assert not proc.is_child  # forked by the zygote, not exec'd here
        procs.append(proc)
        return proc

    yield _start
    if zygote is not None:
        zygote.close()
    for proc in procs:
        if proc.poll() is None:  # a test may have stopped it (SIGSTOP)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
        proc.kill_now()
        if proc.is_child:
            wait(proc)
        proc.close()


# --------------------------------------------------------------------------- plain runs


def test_true_exits_zero_and_writes_every_file(start: Start) -> None:
    proc = start("true")
    result = wait(proc)
    assert result.reason == "exited"
    assert (result.exit_code, result.signal, result.error) == (0, None, None)
    assert result.started_at_ms <= result.ended_at_ms
    d = proc.attempt_dir
    assert int(read(d / "shim.pid")) == proc.pid
    assert int(read(d / "child.pid")) == result.child_pid != proc.pid
    assert set(json.loads(read(d / "result.json"))) == {
        "exit_code", "signal", "reason", "started_at_ms", "ended_at_ms", "child_pid",
        "descendants_killed", "error",
    }  # fmt: skip
    assert not any(p.name.endswith(".tmp") for p in d.iterdir())
    assert read_result(d) == result
    assert proc.poll() is result  # the result is kept once the shim is reaped


def test_exit_code_is_reported(start: Start) -> None:
    result = wait(start("sh", "-c", "exit 3"))
    assert (result.reason, result.exit_code, result.signal) == ("exited", 3, None)


def test_missing_binary_is_a_spawn_error(start: Start) -> None:
    result = wait(start("corral-test-no-such-binary"))
    assert (result.reason, result.exit_code) == ("spawn_error", 127)
    assert result.error == "exec: No such file or directory"


def test_missing_cwd_is_a_spawn_error(start: Start, tmp_path: Path) -> None:
    result = wait(start("true", cwd=str(tmp_path / "nope")))
    assert (result.reason, result.exit_code) == ("spawn_error", 127)
    assert result.error == "chdir: No such file or directory"


def test_cwd_env_stdout_and_stderr(start: Start, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = 'pwd; echo "$FOO"; echo oops >&2'
    proc = start("sh", "-c", script, cwd=str(work), env=ENV | {"FOO": "x y"})
    assert wait(proc).exit_code == 0
    assert read(proc.attempt_dir / "stdout.log") == f"{work}\nx y\n"
    assert read(proc.attempt_dir / "stderr.log") == "oops\n"


def test_large_output_without_newlines_is_complete(start: Start) -> None:
    code = "import sys; sys.stdout.write('x' * 5_000_000)"
    proc = start(sys.executable, "-c", code)
    assert wait(proc).exit_code == 0
    assert (proc.attempt_dir / "stdout.log").stat().st_size == 5_000_000


def test_job_sees_only_stdio_and_no_supervisor_fds(start: Start) -> None:
    code = "import os; print(sorted(os.listdir('/proc/self/fd')), os.getpgid(0) == os.getpid())"
    proc = start(sys.executable, "-c", code)
    assert wait(proc).exit_code == 0
    # fd 3 here is listdir's own directory handle.  The lock, the shim's signalfd and pipe, and
    # fds the test process itself inherited (pytest under a shell) must not reach the job.
    assert read(proc.attempt_dir / "stdout.log") == "['0', '1', '2', '3'] True\n"


def test_lock_is_held_exactly_while_the_shim_lives(start: Start) -> None:
    proc = start("sleep", "30")
    eventually(lambda: (proc.attempt_dir / "shim.pid").exists(), what="shim.pid")
    assert process._lock_held(proc.attempt_dir)
    with pytest.raises(WorkerError, match="already in use"):
        start("true", attempt_dir=proc.attempt_dir)
    proc.kill_now()
    wait(proc)
    assert not process._lock_held(proc.attempt_dir)


# --------------------------------------------------------------------------- stopping


def test_terminate_stops_a_cooperative_job(start: Start) -> None:
    proc = start("sleep", "30")
    t0 = time.monotonic()
    proc.terminate()  # even before the job has exec'd: the early signal is queued, not lost
    result = wait(proc)
    assert (result.reason, result.signal, result.exit_code) == ("terminated", 15, None)
    assert time.monotonic() - t0 < 3


def test_job_ignoring_sigterm_is_killed_after_the_grace(start: Start) -> None:
    proc = start("sh", "-c", 'trap "" TERM; echo ready; sleep 30', grace_s=0.3)
    eventually(lambda: read(proc.attempt_dir / "stdout.log"), what="trap set")
    asked_ms = time.time() * 1000
    proc.terminate()
    proc.terminate()  # a second request does not restart or cut the grace
    result = wait(proc)
    assert (result.reason, result.signal) == ("terminated", 9)
    assert 300 <= result.ended_at_ms - result.started_at_ms < 5000
    assert 250 <= result.ended_at_ms - asked_ms < 5000


@pytest.mark.parametrize("terminate_first", [True, False])
def test_kill_now_skips_the_grace(start: Start, terminate_first: bool) -> None:
    proc = start("sh", "-c", 'trap "" TERM; echo ready; sleep 30', grace_s=30)
    eventually(lambda: read(proc.attempt_dir / "stdout.log"), what="trap set")
    t0 = time.monotonic()
    if terminate_first:
        proc.terminate()
    proc.kill_now()
    result = wait(proc)
    assert (result.reason, result.signal) == ("terminated", 9)
    assert time.monotonic() - t0 < 5


def test_deadline_is_enforced_by_the_shim_alone(start: Start) -> None:
    deadline = time.time() + 0.5
    result = wait(start("sleep", "30", deadline_epoch_s=deadline))
    assert (result.reason, result.signal) == ("deadline", 15)
    assert deadline * 1000 - 1 <= result.ended_at_ms < deadline * 1000 + 5000


# --------------------------------------------------------------------------- nothing survives


DOUBLE_FORK = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(60)\n"
    "    os._exit(0)\n"
)


def at_least(n: int, pids: list[int]) -> list[int] | None:
    return pids if len(pids) >= n else None


def sid(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.sid if stat else None


def test_terminate_kills_every_descendant_even_in_other_sessions(
    start: Start, tmp_path: Path
) -> None:
    oddly = tmp_path / "x) (y z"  # comm with spaces and parentheses, to exercise the stat parsing
    shutil.copy(shutil.which("sleep") or "/bin/sleep", oddly)
    script = (
        f"setsid '{oddly}' 60 & sleep 60 & {sys.executable} -c '{DOUBLE_FORK}'; echo started; wait"
    )
    proc = start("sh", "-c", script)
    eventually(lambda: read(proc.attempt_dir / "stdout.log"), what="job started")
    # sh, `sleep`, the renamed sleep and the double-forked python orphan (now the shim's child)
    child_pid = int(read(proc.attempt_dir / "child.pid"))

    def settled() -> list[int] | None:
        """The whole tree, once the double fork's middle process is gone and its orphan has
        been reparented to the shim (under load that takes a moment)."""
        tree = at_least(4, descendants(proc.pid))
        stats = [read_stat(p) for p in tree or ()]
        if not tree or None in stats:
            return None  # a process of the tree was mid-exit: look again
        orphaned = any(s.ppid == proc.pid for s in stats if s and s.pid != child_pid)
        # and every process has exec'd its program (under load `setsid` may not have yet)
        named = {comm(p) for p in tree} >= {"sh", "sleep", "x) (y z"}
        return tree if orphaned and named else None

    tree = eventually(settled, what="the whole tree, an orphan reparented to the shim")
    assert {comm(p) for p in tree} >= {"sh", "sleep", "x) (y z"}
    assert sum(sid(p) != sid(child_pid) for p in tree) >= 2  # out of reach of a group kill

    proc.terminate()
    result = wait(proc)
    assert result.reason == "terminated"
    assert result.descendants_killed >= 3
    assert [p for p in tree if alive(p)] == []


def test_term_child_only_leaves_the_tree_to_the_child_until_the_grace_ends(
    start: Start, tmp_path: Path
) -> None:
    # The child traps the graceful signal and writes it down; its grandchild (another session,
    # like an agent's tool) is signalled by nobody but the child, then killed at the grace.
    script = (
        "trap 'echo got-term >> trap.log; exit 0' TERM; "
        "setsid sleep 60 & echo $! > grandchild.pid; echo started; "
        "while true; do sleep 0.05; done"
    )
    proc = start("sh", "-c", script, term_child_only=True, grace_s=1.0, cwd=str(tmp_path))
    eventually(lambda: read(proc.attempt_dir / "stdout.log"), what="job started")
    pid_file = tmp_path / "grandchild.pid"
    grandchild = int(
        eventually(lambda: pid_file.exists() and read(pid_file).strip(), what="grandchild")
    )
    proc.terminate()
    result = wait(proc)
    assert result.reason == "terminated"
    assert read(tmp_path / "trap.log") == "got-term\n"  # the child, once
    assert not alive(grandchild)  # and nothing outlives the attempt


def test_leftovers_of_a_job_that_exited_are_killed(start: Start) -> None:
    # the leftover ignores SIGTERM, so the shim has to escalate after min(grace, 2 s)
    script = """setsid sh -c 'trap "" TERM; sleep 60' & echo $!"""
    t0 = time.monotonic()
    proc = start("sh", "-c", script, grace_s=0.3)
    result = wait(proc)
    assert (result.reason, result.exit_code) == ("exited", 0)
    assert result.descendants_killed >= 1
    assert time.monotonic() - t0 < 5
    leftover = int(read(proc.attempt_dir / "stdout.log"))
    assert not alive(leftover)
    assert descendants(proc.pid) == []


# --------------------------------------------------------------------------- recovery


def test_probe_adopts_a_running_shim_and_sees_it_finish(start: Start, tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = start("sh", "-c", f"while [ ! -e '{go}' ]; do sleep 0.02; done; exit 7")
    found = probe(proc.attempt_dir)
    assert found.state is ProbeState.RUNNING
    adopted = found.process
    assert adopted is not None
    assert (adopted.pid, adopted.is_child) == (proc.pid, False)
    assert adopted.poll() is None
    go.touch()
    result = wait(adopted)  # pidfd + lock, no waitpid: as after an engine restart
    adopted.close()
    assert (result.reason, result.exit_code) == ("exited", 7)
    assert wait(proc) == result  # the original parent still reaps its zombie

    found = probe(proc.attempt_dir)
    assert found.state is ProbeState.FINISHED
    assert found.result == result


def test_probe_reports_a_killed_shim_as_vanished(start: Start) -> None:
    proc = start("sleep", "30")
    child = int(eventually(lambda: read(proc.attempt_dir / "child.pid"), what="child.pid"))
    try:
        os.kill(proc.pid, signal.SIGKILL)
        eventually(
            lambda: probe(proc.attempt_dir).state is ProbeState.VANISHED, what="the lock released"
        )
        assert alive(child)  # orphaned to init, yet it does not hold the attempt lock
        lost = wait(proc)
        assert not alive(child), "waiting for a vanished shim stops what it left behind"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    assert (lost.reason, lost.exit_code, lost.signal) == ("lost", None, None)
    assert lost.error == (
        "shim vanished without a result: 1 process(es) of the attempt stopped by the engine"
    )
    assert lost.descendants_killed == 1
    assert probe(proc.attempt_dir).state is ProbeState.VANISHED


def test_a_vanished_shims_escapees_are_found_by_their_marker_and_stopped(start: Start) -> None:
    """setsid and a double fork take a process out of every tree and session; the attempt's
    marker in its environment still finds it once the shim is gone."""
    proc = start("sh", "-c", "setsid sh -c '(sleep 300 &); sleep 300' & exec sleep 300")
    child = int(eventually(lambda: read(proc.attempt_dir / "child.pid"), what="child.pid"))
    marked = eventually(
        lambda: (lambda p: p if len(p) >= 4 else None)(attempt_processes(proc.attempt_dir)),
        what="shim, job and escapees running",
    )
    assert proc.pid in marked and child in marked
    others = [pid for pid in marked if pid not in (proc.pid, child)]
    assert all(read_stat(pid).sid != proc.pid for pid in others)  # type: ignore[union-attr]
    os.kill(proc.pid, signal.SIGKILL)
    lost = wait(proc)
    assert lost.reason == "lost" and lost.descendants_killed >= 3
    assert not any(alive(pid) for pid in marked)
    assert attempt_processes(proc.attempt_dir) == []


def test_an_escapee_that_scrubs_its_environment_is_caught_by_the_attempts_cgroup(
    start: Start,
) -> None:
    """`env -i` drops the marker; the attempt's cgroup (where the host has a writable cgroup
    v2) still holds the process. Without one, the marker is all there is: the escapee lives
    on, as docs/explanation/design.md says."""
    proc = start("sh", "-c", "env -i setsid sleep 300 & exec sleep 300")
    child = int(eventually(lambda: read(proc.attempt_dir / "child.pid"), what="child.pid"))
    escapee = eventually(
        lambda: next((p for p in descendants(proc.pid) if p != child), None),
        what="the escapee running",
    )
    assert escapee not in attempt_processes(proc.attempt_dir) or process.cgroup_base()
    try:
        os.kill(proc.pid, signal.SIGKILL)
        lost = wait(proc)
        assert lost.reason == "lost" and not alive(child)
        if process.cgroup_base() is not None:
            assert not alive(escapee), "the cgroup holds what the marker cannot find"
            cgroup = Path((proc.attempt_dir / "cgroup").read_text())
            assert not cgroup.exists(), "the attempt's cgroup is removed once empty"
        else:
            assert alive(escapee)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escapee, signal.SIGKILL)


def test_an_attempts_cgroup_is_removed_when_it_ends(start: Start) -> None:
    proc = start("sh", "-c", "exit 3")
    assert wait(proc).exit_code == 3
    recorded = proc.attempt_dir / "cgroup"
    assert recorded.exists() == (process.cgroup_base() is not None)
    if recorded.exists():
        assert not Path(recorded.read_text()).exists()


def test_the_job_runs_in_the_attempts_cgroup_and_the_waiter_removes_it(start: Start) -> None:
    """The shim stays in its cgroup to its end while whoever started it lives (a move out
    waits for the kernel, ~10 ms on an idle machine); the one that waits removes it."""
    proc = start("sh", "-c", "cat /proc/self/cgroup; sleep 0.2; exit 4")
    recorded = proc.attempt_dir / "cgroup"
    assert recorded.exists() == (process.cgroup_base() is not None)
    eventually(lambda: proc.poll() is not None, what="the shim ended")
    if recorded.exists():
        cgroup = Path(recorded.read_text())
        lines = read(proc.attempt_dir / "stdout.log").splitlines()
        own = next(line[3:] for line in lines if line.startswith("0::"))
        assert cgroup.as_posix().endswith(own), "the job ran in the attempt's cgroup"
        assert cgroup.exists(), "left for the waiter: the shim's parent lives"
    assert wait(proc).exit_code == 4
    if recorded.exists():
        assert not Path(recorded.read_text()).exists(), "removed once the shim was gone"


def test_an_orphaned_shim_removes_its_cgroup_itself(tmp_path: Path) -> None:
    """An engine that died (its core and the core's zygote with it) does not wait for its
    attempts: the orphaned shim steps out of its cgroup and removes it before its result."""
    zygote = Zygote()
    proc = spawn(
        argv=("sh", "-c", "sleep 0.3; exit 4"),
        attempt_dir=tmp_path / "attempt",
        cwd=None,
        env=ENV,
        grace_s=5.0,
        deadline_epoch_s=None,
        via=zygote,
    )
    try:
        assert not proc.is_child
        zygote.close()  # the shim runs on, reparented
        recorded = proc.attempt_dir / "cgroup"
        assert recorded.exists() == (process.cgroup_base() is not None)
        eventually(lambda: (proc.attempt_dir / "result.json").exists(), what="the job ended")
        if recorded.exists():
            assert not Path(recorded.read_text()).exists(), "removed before the result"
        assert wait(proc).exit_code == 4
    finally:
        proc.kill_now()
        proc.close()


def test_a_stopped_shim_is_killed_with_its_job_once_its_deadline_and_grace_are_past(
    start: Start,
) -> None:
    proc = start(
        "sh", "-c", "sleep 300 & exec sleep 300", grace_s=0.2, deadline_epoch_s=time.time() + 600
    )
    child = int(eventually(lambda: read(proc.attempt_dir / "child.pid"), what="child.pid"))
    os.kill(proc.pid, signal.SIGSTOP)
    eventually(lambda: getattr(read_stat(proc.pid), "state", "") == "T", what="shim stopped")
    now = time.time()
    assert proc.check(now) is False, "before its deadline a stopped shim is left alone"
    proc.deadline_at = now - 0.2 - 2.0  # the deadline and the grace and the slack are past
    assert proc.check(now) is True
    result = wait(proc)
    assert result.reason == "deadline" and "stopped (SIGSTOP)" in (result.error or "")
    assert not alive(child) and attempt_processes(proc.attempt_dir) == []


def test_a_stopped_shim_that_does_not_carry_out_a_stop_is_killed(start: Start) -> None:
    proc = start("sleep", "300", grace_s=0.1)
    child = int(eventually(lambda: read(proc.attempt_dir / "child.pid"), what="child.pid"))
    os.kill(proc.pid, signal.SIGSTOP)
    eventually(lambda: getattr(read_stat(proc.pid), "state", "") == "T", what="shim stopped")
    proc.terminate()  # queued: the shim cannot act on it
    assert proc.check(time.time()) is False, "within the grace and slack: not yet"
    assert proc.check(time.time() + 0.1 + 2.0) is True
    result = wait(proc)
    assert result.reason == "terminated" and not alive(child)


def test_a_stopped_shim_whose_job_ended_is_continued_to_report_it(start: Start) -> None:
    proc = start("sh", "-c", "sleep 0.3; exit 5")
    child = int(eventually(lambda: read(proc.attempt_dir / "child.pid"), what="child.pid"))
    os.kill(proc.pid, signal.SIGSTOP)
    eventually(lambda: not alive(child), what="the job ended under a stopped shim")
    assert proc.check(time.time()) is False  # nothing is late: only continued
    result = wait(proc)
    assert (result.reason, result.exit_code) == ("exited", 5)


def test_probe_of_an_attempt_never_started(tmp_path: Path) -> None:
    assert probe(tmp_path / "missing").state is ProbeState.NOT_STARTED
    assert probe(tmp_path).state is ProbeState.NOT_STARTED
    (tmp_path / "stdout.log").touch()  # an empty directory with files, but no shim ever
    assert probe(tmp_path).state is ProbeState.NOT_STARTED
    assert read_result(tmp_path) is None


def test_probe_of_an_attempt_never_started_removes_the_cgroup_made_for_it(
    tmp_path: Path,
) -> None:
    """A core killed after it made the attempt's cgroup and before it started the shim."""
    base = process.cgroup_base()
    if base is None:  # no writable cgroup v2 here: nothing could be left behind
        assert probe(tmp_path).state is ProbeState.NOT_STARTED
        return
    cgroup = base / f"never-started-{tmp_path.name}"
    cgroup.mkdir()
    try:
        (tmp_path / "cgroup").write_text(str(cgroup))
        assert probe(tmp_path).state is ProbeState.NOT_STARTED
        assert not cgroup.exists()
    finally:
        if cgroup.exists():
            cgroup.rmdir()


# --------------------------------------------------------------------------- building


def test_shim_is_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_SHIM_DIR", str(tmp_path))
    built = native._build("shim")
    assert built.parent == tmp_path and built.name.startswith("corral-shim-")
    assert os.access(built, os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temp file left behind
    assert native._build("shim") == built
    assert native.shim_path() is native.shim_path()


def test_a_shipped_binary_of_this_source_is_used_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_SHIM_DIR", str(tmp_path / "cache"))
    built = native._build("shim")  # what a wheel's build puts in bin/
    shipped = tmp_path / "bin"
    shipped.mkdir()
    (shipped / built.name).write_bytes(built.read_bytes())
    (shipped / built.name).chmod(0o755)
    (shipped / "corral-hook-000000000000").write_bytes(b"")  # another source's: never used
    monkeypatch.setattr(native, "SHIPPED", shipped)
    monkeypatch.setenv("CORRAL_SHIM_DIR", str(tmp_path / "other-cache"))
    monkeypatch.setenv("CC", "corral-test-no-such-cc")
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler
    assert native._build("shim") == shipped / built.name
    assert not (tmp_path / "other-cache").exists()
    with pytest.raises(WorkerError, match="no C compiler found"):
        native._build("hook")  # no binary of its source shipped: it would have to compile


def test_missing_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_SHIM_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "corral-test-no-such-cc")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(WorkerError, match="no C compiler found to build corral-shim"):
        native._build("shim")


def test_a_reused_attempt_dir_never_reports_a_stale_result(start: Start, tmp_path: Path) -> None:
    attempt = tmp_path / "reused"
    assert wait(start("true", attempt_dir=attempt)).reason == "exited"
    proc = start("sleep", "30", attempt_dir=attempt)
    child = int(eventually(lambda: read(attempt / "child.pid"), what="child.pid"))
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(child, signal.SIGKILL)
    assert wait(proc).reason == "lost"  # not the first run's "exited"
    assert probe(attempt).state is ProbeState.VANISHED


def test_wait_without_a_pidfd_falls_back_to_polling(start: Start) -> None:
    proc = start("sh", "-c", "exit 4")
    proc.close()  # as on a kernel without pidfd_open
    assert proc.pidfd is None
    assert wait(proc).exit_code == 4
