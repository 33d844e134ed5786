"""The runner between the shim and an agent CLI: the CLI's output and status pass through it."""

from __future__ import annotations

import signal
import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral.workers.runner", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_writes_to_the_runners_own_stdout_and_stderr_and_its_status_is_kept() -> None:
    # the runner neither reads nor rewrites the stream: the shim's pump redacts it
    out = run("--", "sh", "-c", "echo out; echo err >&2; ls -l /proc/$$/fd/1 >&2; exit 3")
    assert (out.returncode, out.stdout) == (3, "out\n")
    assert out.stderr.startswith("err\n") and "pipe:" in out.stderr  # the runner's own pipe


def test_a_cli_killed_by_a_signal_exits_128_plus_the_signal() -> None:
    out = run("--", "sh", "-c", "kill -KILL $$")
    assert out.returncode == 128 + signal.SIGKILL


def test_a_cli_that_cannot_start_is_exit_127() -> None:
    out = run("--", "corral-test-no-such-cli")
    assert out.returncode == 127 and "cannot start corral-test-no-such-cli" in out.stderr
