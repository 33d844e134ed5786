"""The benchmark keeps working: its crash-recovery workload (W3, quick) loses and duplicates
nothing. Figures are not asserted here (bench/ measures them); correctness is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_quick_w3_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "w3.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only",
                        "W3", "--out", str(out)], capture_output=True, text=True, timeout=180,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    w3 = json.loads(out.read_text())["workloads"]["W3"]
    assert (w3["lost"], w3["duplicated"]) == (0, 0)
    assert w3["states"] == {"SUCCEEDED": w3["jobs"]}
