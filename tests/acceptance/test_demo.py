"""The README's first command: `corral demo` governs its fleet to the expected summary."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.acceptance.conftest import CORRAL


def test_demo_fleet_ends_as_governed(tmp_path: Path) -> None:
    r = subprocess.run([CORRAL, "demo", "--data-dir", str(tmp_path / "demo")],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo finished: every job ended as governed" in r.stdout
    assert "9 submissions, 8 jobs (the duplicate was coalesced)" in r.stdout
    for line in ("flaky", "hang", "cancel-me"):
        assert any(row.strip().startswith(f"✓ {line}") for row in r.stdout.splitlines())
    assert not (tmp_path / "demo" / "engine.sock").exists(), "the demo engine was stopped"
