"""The README's first command: `corral demo` governs its fleet to the expected summary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.acceptance.conftest import CORRAL


def test_demo_fleet_ends_as_governed(tmp_path: Path) -> None:
    r = subprocess.run(
        [CORRAL, "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo finished: every job ended as governed" in r.stdout
    assert "11 submissions, 10 jobs (the duplicate was coalesced)" in r.stdout
    rows = [row.strip() for row in r.stdout.splitlines()]
    for name, state in (
        ("flaky", "DEAD_LETTERED"),
        ("hang", "TIMED_OUT"),
        ("cancel-me", "CANCELLED"),
        ("delete pods", "DENIED"),
        ("runaway", "KILLED"),
    ):
        assert any(row.startswith(f"✓ {name}") and f" {state} " in row for row in rows), name
    assert any(row.startswith("✓ audit:") and row.endswith("chain intact") for row in rows)
    assert not (tmp_path / "demo" / "engine.sock").exists(), "the demo engine was stopped"


def test_the_demo_leaves_no_temporary_directory_behind(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    env.pop("CORRAL_DATA_DIR", None)
    r = subprocess.run(
        [CORRAL, "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(scratch.iterdir()) == [], "its data directory is removed at the end"
    assert "inspect:" not in r.stdout
