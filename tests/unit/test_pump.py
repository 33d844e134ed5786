"""The output path of an attempt: corral-shim's pump redacts and caps what a real job writes."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.workers import process
from corral.workers.process import Output, ShimProcess, spawn
from corral.workers.proctab import descendants
from tests.helpers import eventually
from tests.unit.test_shim import ENV, read, wait

SECRET = "corral-canary-pump-51f0e3"
KEY = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    procs: list[ShimProcess] = []

    def _start(*argv: str, output: Output | None = None, **kw: Any) -> ShimProcess:
        kw.setdefault("grace_s", 2.0)
        proc = spawn(
            attempt_dir=tmp_path / f"attempt-{len(procs)}",
            argv=argv,
            cwd=None,
            env=kw.pop("env", ENV),
            deadline_epoch_s=None,
            output=output or Output(secrets=(SECRET,)),
            **kw,
        )
        procs.append(proc)
        return proc

    yield _start
    for proc in procs:
        proc.kill_now()
        wait(proc)
        proc.close()


def files_holding(root: Path, *needles: str) -> list[str]:
    return [
        f"{p}: {n}"
        for p in root.rglob("*")
        if p.is_file()
        for n in needles
        if n.encode() in p.read_bytes()
    ]


def pump_of(proc: ShimProcess) -> list[int]:
    """The pump: the shim's child running the pump's code (a job still between fork and exec
    has the shim's command line, which names the pump too)."""
    found = []
    for pid in descendants(proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        python = [sys.executable.encode(), b"-I"]
        if len(argv) > 4 and argv[:2] == python and b"corral.workers.pump" in argv[4]:
            found.append(pid)
    return found


def test_secrets_never_reach_the_logs_even_split_across_two_writes(start: Any) -> None:
    half = len(SECRET) // 2
    script = (
        f"echo out {SECRET}; echo err {KEY} >&2; printf 'split {SECRET[:half]}'; "
        f"sleep 0.3; echo '{SECRET[half:]} done'"
    )
    proc = start("sh", "-c", script)
    result = wait(proc)
    assert (result.reason, result.exit_code) == ("exited", 0)
    d = proc.attempt_dir
    assert read(d / "stdout.log") == "out [REDACTED]\nsplit [REDACTED] done\n"
    assert read(d / "stderr.log") == "err [REDACTED]\n"
    assert files_holding(d, SECRET, KEY, SECRET[:half]) == []


def test_the_job_gets_neither_the_secrets_nor_the_pumps_descriptors(start: Any) -> None:
    code = "import os; print(sorted(os.listdir('/proc/self/fd')))"
    proc = start(sys.executable, "-c", code)
    assert wait(proc).exit_code == 0
    # fd 3 is listdir's own handle; 1 and 2 are pipes to the pump, not the logs
    assert read(proc.attempt_dir / "stdout.log") == "['0', '1', '2', '3']\n"


def test_a_job_that_writes_nothing_starts_no_pump_one_that_writes_does(start: Any) -> None:
    silent = start("sleep", "30")
    job = eventually(lambda: [p for p in descendants(silent.pid) if p], what="the job")
    assert pump_of(silent) == [] and len(job) == 1
    talking = start("sh", "-c", "echo hello; exec sleep 30")
    eventually(lambda: read(talking.attempt_dir / "stdout.log"), what="the first line")
    assert len(pump_of(talking)) == 1


def test_tree_kills_spare_the_pump_which_writes_the_last_words(start: Any) -> None:
    # the job prints while it is being stopped: what it wrote reaches the log
    script = "trap 'echo stopping; exit 3' TERM; echo ready; while :; do sleep 0.05; done"
    proc = start("sh", "-c", script)
    eventually(lambda: read(proc.attempt_dir / "stdout.log"), what="ready")
    proc.terminate()
    result = wait(proc)
    assert result.reason == "terminated"
    assert read(proc.attempt_dir / "stdout.log") == "ready\nstopping\n"


def test_output_past_the_cap_stops_the_job_and_keeps_head_and_tail(start: Any) -> None:
    code = (
        "import sys, time\nsys.stdout.write('HEAD')\nwhile True:\n"
        "    sys.stdout.write('x' * 65536)\n    sys.stdout.flush()\n"
    )
    proc = start(
        sys.executable,
        "-c",
        code,
        output=Output(max_bytes=1 << 20, tail_bytes=4096, secrets=(SECRET,)),
    )
    result = wait(proc, timeout=30)
    assert (result.reason, result.signal) == ("output", signal.SIGTERM)
    log = (proc.attempt_dir / "stdout.log").read_bytes()
    assert log.startswith(b"HEADxxxx")
    head, marker, tail = log.partition(b"\n[corral: output cap of 1048576 bytes reached: ")
    assert marker and len(head) <= 1 << 20
    omitted, _, rest = tail.partition(b" bytes left out; the last 4096 follow]\n")
    assert int(omitted) > 0 and rest == b"x" * 4096


def test_a_job_that_ends_past_the_cap_by_itself_is_still_reported_at_the_cap(start: Any) -> None:
    code = "import sys; sys.stdout.write('y' * 3_000_000)"
    proc = start(sys.executable, "-c", code, output=Output(max_bytes=1 << 20, tail_bytes=100))
    result = wait(proc, timeout=30)
    assert result.reason == "output"
    size = (proc.attempt_dir / "stdout.log").stat().st_size
    assert size < (1 << 20) + 300


def test_a_pump_that_dies_stops_the_job_rather_than_let_anything_out_unredacted(start: Any) -> None:
    proc = start("sh", "-c", "echo first; while :; do echo more; sleep 0.05; done")
    [pump] = eventually(lambda: pump_of(proc), what="the pump")
    os.kill(pump, signal.SIGKILL)
    result = wait(proc)
    assert result.reason == "lost"
    assert result.error is not None and "output pump ended" in result.error


def test_logs_and_result_are_private_and_the_job_keeps_the_umask_corral_started_with(
    start: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_JOB_UMASK", "022")
    old = os.umask(0o077)
    try:
        proc = start("sh", "-c", f"echo x; touch {tmp_path / 'made-by-job'}")
        assert wait(proc).exit_code == 0
    finally:
        os.umask(old)
    assert (tmp_path / "made-by-job").stat().st_mode & 0o777 == 0o644
    modes = {p.name: p.stat().st_mode & 0o777 for p in proc.attempt_dir.iterdir()}
    cgroup = {"cgroup": 0o600} if process.cgroup_base() is not None else {}
    assert modes == {
        "stdout.log": 0o600,
        "stderr.log": 0o600,
        "result.json": 0o600,
        "shim.pid": 0o600,
        "child.pid": 0o600,
        **cgroup,
    }
    assert proc.attempt_dir.stat().st_mode & 0o777 == 0o700
