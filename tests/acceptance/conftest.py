"""Acceptance tests drive the real `corral` command and real processes (SIGKILL included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.runtime.control import poke
from corral.workers.proctab import alive as alive  # the acceptance tests import it from here
from tests.helpers import eventually

CORRAL = str(Path(sys.executable).with_name("corral"))

CONFIG = """\
scheduler:
  poll_interval_s: 0.2
roles:
  default:
    concurrency: 4
    retry: {base_s: 0.05, cap_s: 0.2}
  serial:
    concurrency: 1
    retry: {base_s: 0.05, cap_s: 0.2}
environments:
  local:
    max_inflight: 8
"""


def quiet_http(args: tuple[str, ...]) -> tuple[str, ...]:
    """`serve` without the HTTP API unless the test asks for it (`--http …`): many engines run
    at once here, and the default address is one."""
    if args[:1] == ("serve",) and "--http" not in args and "--no-http" not in args:
        return ("serve", "--no-http", *args[1:])
    return args


class Corral:
    """One data directory and the `corral` command pointed at it."""

    def __init__(self, root: Path, config: str = CONFIG) -> None:
        self.data = root / "data"
        self.data.mkdir(parents=True)
        self.work = root / "work"
        self.work.mkdir()
        self.config = root / "corral.yaml"
        self.config.write_text(config)
        self.engines: list[subprocess.Popen[bytes]] = []

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CORRAL_DATA_DIR"] = str(self.data)
        env["CORRAL_CONFIG"] = str(self.config)
        env.pop("CORRAL_STORE_URL", None)
        return env

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CORRAL, *quiet_http(args)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.work,
            stdin=subprocess.DEVNULL,
        )

    def ok(self, *args: str) -> str:
        r = self.run(*args)
        assert r.returncode == 0, f"corral {' '.join(args)} → {r.returncode}\n{r.stderr}"
        return r.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def submit(self, *command: str, opts: tuple[str, ...] = ()) -> str:
        return self.ok("submit", *opts, "--", *command).strip()

    def job(self, job_id: str) -> dict[str, Any]:
        data: dict[str, Any] = self.json("show", job_id)
        return data

    def serve(self, *extra: str) -> subprocess.Popen[bytes]:
        """Start an engine; unless it drains, return once it answers on its socket."""
        log = (self.data / "engine-test.log").open("ab")
        proc = subprocess.Popen(
            [CORRAL, *quiet_http(("serve", *extra))],
            env=self.env(),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            cwd=self.work,
        )
        self.engines.append(proc)
        if "--drain" not in extra:
            eventually(
                lambda: proc.poll() is not None or poke(self.data, "ping"),
                timeout=30,
                what="the engine to answer",
            )
            assert proc.poll() is None, self.engine_log()
        return proc

    def wait(self, job_id: str, *, until: str = "end", timeout: float = 30) -> int:
        return self.run(
            "wait", job_id, "--for", until, "--timeout", str(timeout), timeout=timeout + 30
        ).returncode

    def drain(self, timeout: float = 60) -> None:
        """Run an engine until nothing is left to do."""
        proc = self.serve("--drain")
        assert proc.wait(timeout=timeout) == 0, self.engine_log()

    def engine_log(self) -> str:
        path = self.data / "engine-test.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for proc in self.engines:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    c = Corral(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def clis() -> None:
    """The pinned agent CLIs, installed by the project's own script (a failure fails the
    tests that need them)."""
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [str(root / "scripts" / "agent-clis")],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
