"""The README's Quickstart, run as written: one shell, line after line, each with the exit code
the page announces (0 unless its comment says otherwise)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from corral.runtime.servelock import engine_holds

ROOT = Path(__file__).resolve().parents[2]
MARK = "__corral_rc__"


def quickstart() -> list[tuple[str, int]]:
    """Each command of the Quickstart block and the exit code its comment announces."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        command, _, comment = line.partition("  # ")
        command = command.strip()
        if not command or command.startswith("#") or command.startswith("scripts/setup"):
            continue
        announced = re.search(r"\b(?:exits|here) (\d+)", comment)
        out.append((command, int(announced.group(1)) if announced else 0))
    return out


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    steps = quickstart()
    assert any(c.startswith("corral serve &") for c, _ in steps)
    script = ["set -m"] + [f"{command}\necho {MARK} $? {i}" for i, (command, _) in enumerate(steps)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_DATA_DIR"] = str(tmp_path / "data")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    work = tmp_path / "work"
    work.mkdir()
    try:
        r = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=work,
            env=env,
            text=True,
            capture_output=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    finally:
        _stop_engine(tmp_path / "data")
    got = {int(i): int(rc) for rc, i in re.findall(rf"^{MARK} (\d+) (\d+)$", r.stdout, re.M)}
    report = "\n".join(
        f"{got.get(i)} (announced {want})  {command}" for i, (command, want) in enumerate(steps)
    )
    assert got == {i: want for i, (_, want) in enumerate(steps)}, (
        f"{report}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    )
    output = r.stdout + r.stderr
    assert "corral: error" not in output and "Traceback" not in output, output[-3000:]


def _stop_engine(data: Path) -> None:
    """The Quickstart stops its engine itself (`kill %1`); if it failed before, stop it here."""
    lock = data / "engine.lock"
    if engine_holds(data) and (pid := lock.read_text().strip()).isdigit():  # ours, still alive
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)
