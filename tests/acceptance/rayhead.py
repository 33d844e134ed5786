"""A private Ray head on loopback for the acceptance tests (test_ray.py, test_training.py):
its own ports, its own temporary directory, its own process group, stopped by killing that
group (never `ray stop`, which stops every Ray on the host)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers import eventually

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Head:
    def __init__(self, address: str, proc: subprocess.Popen[bytes]) -> None:
        self.address = address
        self.proc = proc

    def client(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address)

    def jobs(self, corral_job: str) -> list[Any]:
        """Ray's jobs for one Corral job (their submission ids carry the Corral job id)."""
        return [
            j
            for j in self.client().list_jobs()
            if (j.submission_id or "").startswith(f"corral-{corral_job}-")
        ]

    def raw(self, sid: str) -> str:
        with urllib.request.urlopen(f"{self.address}/api/jobs/{sid}", timeout=10) as r:
            return str(r.read().decode())


@contextlib.contextmanager
def running_head() -> Iterator[Head]:
    # A short root: Ray's socket paths under it must stay within the 107-byte limit.
    root = tempfile.mkdtemp(prefix="cr-ray-", dir="/tmp")
    port, dash = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env["RAY_TMPDIR"] = root
    log = open(os.path.join(root, "head.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *(RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port)),
            *("--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash)),
            *("--include-dashboard", "true", "--num-cpus", "8", "--temp-dir", root),
            # private ports for the agent and the client server too: the defaults (52365,
            # 10001) are shared by every head on the host, and a second head's agent fails
            *("--dashboard-agent-listen-port", str(free_port())),
            *("--ray-client-server-port", str(free_port())),
            *("--disable-usage-stats", "--block"),
        ],
        env=env,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    h = Head(f"http://127.0.0.1:{dash}", proc)
    try:

        def up() -> bool:
            assert proc.poll() is None, Path(root, "head.log").read_text(errors="replace")
            try:
                h.client().list_jobs()
            except Exception:
                return False
            return True

        eventually(up, timeout=120, what="the Ray head's job server")
        yield h
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
