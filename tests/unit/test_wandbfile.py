"""The offline W&B run file reader against files the pinned wandb really writes, and against
files it did not write (bad header, a checksum that fails, truncation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.trace import wandbfile

pytest.importorskip("wandb", reason="the training extra is part of the dev set-up")

pytestmark = pytest.mark.training

WRITER = """
import wandb
run = wandb.init(id="corral-J1-2", config={"lr": 0.5, "nested": {"depth": 2}},
                 tags=["corral", "corral-job-J1"], project="p")
for step in range(40):
    run.log({"train/loss": 3.0 / (step + 1), "note": f"step {step}", "ok": step % 2 == 0,
             "count": step})
run.summary["best"] = -1.25
run.finish()
"""


def write_run(root: Path, script: str, run_id: str) -> Path:
    """The offline run file the pinned wandb writes running `script` in `root`."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120, cwd=root)
    (found,) = root.glob(f"wandb/offline-run-*/run-{run_id}.wandb")
    return found


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("wandb"), WRITER, "corral-J1-2")


def test_reads_the_run_its_config_summary_and_history(run_file: Path) -> None:
    run = wandbfile.read(run_file)
    assert run.run_id == "corral-J1-2"
    assert run.project == "p"
    assert run.tags == ["corral", "corral-job-J1"]
    assert run.config["lr"] == 0.5 and run.config["nested"] == {"depth": 2}
    assert run.summary["best"] == -1.25
    assert run.summary["train/loss"] == pytest.approx(3.0 / 40)
    assert run.exit_code == 0
    loss = run.series("train/loss")
    assert [s for s, _ in loss] == [float(i) for i in range(40)]
    assert [v for _, v in loss] == pytest.approx([3.0 / (i + 1) for i in range(40)])
    assert run.history[3]["note"] == "step 3" and run.history[3]["ok"] is False
    assert run.history[7]["count"] == 7


def test_a_file_that_is_not_a_run_file_is_a_clear_error(tmp_path: Path, run_file: Path) -> None:
    bad = tmp_path / "x.wandb"
    bad.write_bytes(b"hello world, not a run")
    with pytest.raises(wandbfile.RunFileError, match="not a W&B run file"):
        wandbfile.read(bad)
    data = bytearray(run_file.read_bytes())
    data[20] ^= 0xFF  # inside the first record
    bad.write_bytes(bytes(data))
    with pytest.raises(wandbfile.RunFileError, match="checksum"):
        wandbfile.read(bad)
    with pytest.raises(wandbfile.RunFileError, match="cannot read"):
        wandbfile.read(tmp_path / "missing.wandb")


def test_a_run_file_cut_short_reads_what_was_written(tmp_path: Path, run_file: Path) -> None:
    """A run still going on: its last record is partly written."""
    data = run_file.read_bytes()
    cut = tmp_path / "cut.wandb"
    cut.write_bytes(data[: len(data) // 2])
    run = wandbfile.read(cut)
    assert run.run_id == "corral-J1-2"
    assert 0 < len(run.series("train/loss")) < 40
    assert run.exit_code is None
