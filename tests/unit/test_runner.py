"""The runner between the shim and an agent CLI: what it redacts, and from where it learns it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SECRET = "mcp-secret-value-7c1f02"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.workers.runner", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_values_from_the_redact_file_are_redacted_and_the_file_is_deleted(tmp_path: Path
                                                                          ) -> None:
    values = tmp_path / "redact.json"
    values.write_text(json.dumps([SECRET]))
    out = run("--redact-file", str(values), "--", "sh", "-c",
              f"echo token {SECRET}; echo err {SECRET} >&2; printenv | grep -c {SECRET}")
    assert SECRET not in out.stdout + out.stderr
    assert "token [REDACTED]" in out.stdout and "err [REDACTED]" in out.stderr
    assert out.stdout.splitlines()[-1] == "0"  # never in the CLI's environment
    assert not values.exists()


def test_a_redact_file_that_cannot_be_read_stops_the_run_before_the_cli(tmp_path: Path) -> None:
    out = run("--redact-file", str(tmp_path / "missing.json"), "--", "sh", "-c", "echo ran")
    assert out.returncode == 70 and "ran" not in out.stdout
    assert "cannot read" in out.stderr
