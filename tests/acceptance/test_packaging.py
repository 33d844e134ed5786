"""The built wheel, installed where there is no C compiler, runs a job end to end.

This mirrors the Dockerfile's steps: the builder stage builds the wheel (the only step that
compiles anything: corral-shim and corral-hook go into the wheel), the final stage installs it
into a clean virtual environment on a machine without a compiler and runs the image's own
command (its ENTRYPOINT and CMD, read from the Dockerfile, on a loopback address here) with the
image's own HEALTHCHECK command. Here the clean environment takes Corral from the wheel alone; its
third-party dependencies come from this checkout's environment (a path file), so the test needs
no package registry.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPILERS = ("cc", "gcc", "clang", "c99", "tcc")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    env: dict[str, str]

    @property
    def corral(self) -> str:
        return str(self.venv / "bin" / "corral")

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.corral, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def from_bash(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`corral ARGS` run by a bash shell, its parent."""
        line = " ".join(shlex.quote(a) for a in (self.corral, *args))
        return subprocess.run(
            ["/bin/bash", "-c", f"{line} && :"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )


def build_wheel(into: Path) -> Path:
    """Build the sdist from a copy of the sources (the checkout stays untouched), then the
    wheel from that sdist, as pip does for a source install: offline, with this environment's
    setuptools. The wheel's native helpers are compiled from the sources the sdist carries."""
    src = into / "src-copy"
    shutil.copytree(
        ROOT / "src",
        src / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "bin"),
    )
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    dist = into / "dist"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from setuptools import build_meta as b; b.build_sdist({str(dist)!r})",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    (sdist,) = dist.glob("corral-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "src/corral/workers/shim.c", "src/corral/workers/hook.c"} <= names
    assert not any("/workers/bin/" in n for n in names)  # sources only: built on install
    out = into / "wheels"
    r = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps"),
            *("--disable-pip-version-check", "-w", str(out), str(sdist)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    (built,) = out.glob("corral-*.whl")
    # the release step: auditwheel checks what the helpers link to (libc alone) and tags the
    # wheel manylinux for the oldest glibc they allow
    repaired = into / "manylinux"
    r = subprocess.run(
        [str(BIN / "auditwheel"), "repair", "-w", str(repaired), str(built)],
        env={**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = repaired.glob("corral-*.whl")
    return wheel


def built_once(factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once per test run: the run's test workers share the temporary root
    (pytest-xdist gives each its own directory under it), and the first one builds."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # <run's temp>/popen-gwN: the run's is above
        base = base.parent
    shared = base / "corral-wheel"
    shared.mkdir(exist_ok=True)
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted((shared / "manylinux").glob("corral-*.whl"))
        if found:
            return found[0]
        for leftover in ("src-copy", "dist", "wheels"):  # a build that failed half-way
            shutil.rmtree(shared / leftover, ignore_errors=True)
        return build_wheel(shared)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    wheel = built_once(tmp_path_factory)
    venv = root / "venv"
    # a venv without pip of its own (ensurepip is slow): this environment's pip installs into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    r = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")),
            *("install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check"),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    site = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies (not Corral: its editable install is not on a plain path) from here
    Path(site, "corral-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    tools = root / "tools"  # the only programs on PATH besides the venv's: no compiler
    tools.mkdir()
    for name in ("sh", "env", "echo", "sleep", "true"):
        found = shutil.which(name)
        if found:
            (tools / name).symlink_to(found)
    env = {
        "PATH": f"{venv / 'bin'}:{tools}",
        "HOME": str(root / "home"),
        "CORRAL_SHIM_DIR": str(root / "shim-cache"),
        "CORRAL_DATA_DIR": str(root / "data"),
        "LANG": "C.UTF-8",
    }
    yield Installed(wheel, venv, env)


def test_the_wheel_is_tagged_for_the_platform_and_carries_what_the_docs_promise(
    installed: Installed,
) -> None:
    tag = rf"py3-none-manylinux_2_\d+_{platform.machine()}"
    assert re.fullmatch(rf"corral-[\d.]+-{tag}\.whl", installed.wheel.name), installed.wheel.name
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert "corral/examples/corral.yaml" in names
    assert any(n.startswith("corral/workers/bin/corral-shim-") for n in names)
    assert any(n.startswith("corral/workers/bin/corral-hook-") for n in names)
    assert "corral/workers/shim.c" in names  # the source stays beside the binary it built


def test_no_compiler_is_on_the_path(installed: Installed) -> None:
    for name in COMPILERS:
        assert shutil.which(name, path=installed.env["PATH"]) is None, name


def test_init_writes_the_shipped_example_and_it_checks(
    installed: Installed, tmp_path: Path
) -> None:
    r = installed.run("init", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "corral.yaml").read_text().startswith("#")
    r = installed.run("config", "check", "--config", str(tmp_path / "corral.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_version_and_shell_completion(installed: Installed) -> None:
    assert installed.run("--version").stdout.strip() == installed.run("version").stdout.strip()
    assert installed.run("--version").stdout.strip() in installed.wheel.name
    # "for the current shell" (docs/reference/cli.md): typer finds it among the command's
    # parents, so each runs from bash (`&& :` keeps bash from exec'ing it in its own place)
    shown = installed.from_bash("--show-completion")
    assert shown.returncode == 0 and "_corral_completion" in shown.stdout, shown.stderr
    r = installed.from_bash("--install-completion")
    assert r.returncode == 0, r.stderr
    home = Path(installed.env["HOME"])
    assert "_corral_completion" in (home / ".bash_completions" / "corral.sh").read_text()
    assert ".bash_completions/corral.sh" in (home / ".bashrc").read_text()
    completes = subprocess.run(
        [installed.corral],
        env={**installed.env, "_CORRAL_COMPLETE": "complete_bash"}
        | {"COMP_WORDS": "corral config ch", "COMP_CWORD": "2"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert completes.stdout.split() == ["check"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, dict[str, object]]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, json.loads(resp.read())


def dockerfile() -> dict[str, list[str]]:
    """The Dockerfile's exec-form instructions (ENTRYPOINT, CMD, HEALTHCHECK's CMD), the last
    of each, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = line.split(None, 1)
        if not words or words[0] not in ("ENTRYPOINT", "CMD", "HEALTHCHECK"):
            continue
        rest = words[1]
        if words[0] == "HEALTHCHECK":
            rest = rest[rest.index(" CMD ") + 5 :]
        found[words[0]] = json.loads(rest)
    return found


def test_the_image_command_and_its_healthcheck_are_what_runs_here() -> None:
    d = dockerfile()
    assert d["ENTRYPOINT"] == ["corral"]
    assert d["CMD"][:3] == ["serve", "--http", "0.0.0.0:8765"]
    assert d["HEALTHCHECK"][0] == "python"


def test_the_image_steps_serve_and_run_a_job_without_a_compiler(installed: Installed) -> None:
    port = free_port()
    image = dockerfile()
    command = [a.replace("0.0.0.0:8765", f"127.0.0.1:{port}") for a in image["CMD"]]
    healthcheck = [str(installed.venv / "bin" / "python"), *image["HEALTHCHECK"][1:]]
    health_env = {**installed.env, "CORRAL_HEALTH_URL": f"http://127.0.0.1:{port}/healthz"}
    assert subprocess.run(healthcheck, env=health_env, capture_output=True).returncode != 0
    engine = subprocess.Popen(
        [installed.corral, *command],
        env=installed.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:

        def probes() -> bool | None:
            assert engine.poll() is None, engine.stderr.read().decode() if engine.stderr else ""
            try:
                return get(f"http://127.0.0.1:{port}/readyz")[0] == 200 or None
            except OSError:
                return None

        eventually(probes, timeout=30, what="the engine's readiness probe")
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        checked = subprocess.run(healthcheck, env=health_env, capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        r = installed.run("submit", "--wait", "--json", "--", "/bin/echo", "hi from the wheel")
        assert r.returncode == 0, r.stdout + r.stderr
        job = json.loads(r.stdout)["id"]
        shown = json.loads(installed.run("show", job, "--json").stdout)
        assert shown["state"] == "SUCCEEDED", shown
        logs = installed.run("logs", job)
        assert "hi from the wheel" in logs.stdout
        # the shim that ran is the wheel's: nothing was compiled into the cache
        assert not Path(installed.env["CORRAL_SHIM_DIR"]).exists()
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(timeout=20)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
