"""Reading an offline W&B run file: Corral's stdlib reader (trace/wandbfile.py) against
wandb's own protobuf classes decoding the same records, in the same process.

    .venv/bin/python bench/wandbfile.py [--steps 2000] [--metrics 10] [--repeat 5]

The run file is written first by the pinned wandb (offline, in a temporary directory). Both
sides split the file into records with the same framing code; the baseline then parses each
record with `wandb_internal_pb2.Record.FromString` and builds the same history rows and
summary from its items (`value_json` or the typed fields), so the ratio is the cost of the
protobuf decoding and the item handling: what `corral show` pays per run. Prints the median of
`--repeat` rounds of each, and the ratio reader / baseline (< 1: the reader is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from corral.trace import wandbfile

WRITER = """
import sys, wandb
steps, metrics = int(sys.argv[1]), int(sys.argv[2])
run = wandb.init(id="bench-run", config={{"lr": 0.1, "layers": 2}})
for step in range(steps):
    run.log({{f"train/m{{i}}": 1.0 / (step + i + 1) for i in range(metrics)}})
run.finish()
"""


def write_run(root: Path, steps: int, metrics: int) -> Path:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    script = WRITER.replace("{{", "{").replace("}}", "}")
    subprocess.run(
        [sys.executable, "-c", script, str(steps), str(metrics)], env=env, check=True, cwd=root
    )
    (found,) = root.glob("wandb/offline-run-*/run-bench-run.wandb")
    return found


def baseline(data: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from wandb.proto import wandb_internal_pb2 as pb

    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for raw in wandbfile.records(data):
        rec = pb.Record.FromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row: dict[str, Any] = {}
            for item in rec.history.item:
                field = item.WhichOneof("value")
                value = (
                    json.loads(item.value_json)
                    if item.value_json
                    else getattr(item, field)
                    if field
                    else None
                )
                row[item.key or "/".join(item.nested_key)] = value
            history.append(row)
        elif kind == "summary":
            for s in rec.summary.update:
                summary[s.key or "/".join(s.nested_key)] = json.loads(s.value_json)
    return history, summary


def timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-wandb-") as tmp:
        path = write_run(Path(tmp), args.steps, args.metrics)
        data = path.read_bytes()
    ours = wandbfile.parse(data)
    theirs, summary = baseline(data)
    assert len(ours.history) == len(theirs) == args.steps, (len(ours.history), len(theirs))
    key = "train/m0"
    assert [r[key] for r in ours.history] == [r[key] for r in theirs]
    assert ours.summary[key] == summary[key]
    reader, base = [], []
    for i in range(args.repeat):  # alternate which goes first
        pair = [("reader", wandbfile.parse), ("baseline", baseline)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (reader if name == "reader" else base).append(timed(fn, data))
    r, b = statistics.median(reader), statistics.median(base)
    print(
        f"run file {len(data) / 1024:.0f} KiB, {args.steps} steps × {args.metrics} metrics; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"corral reader   {r * 1000:8.1f} ms (median of {args.repeat})")
    print(f"wandb protobuf  {b * 1000:8.1f} ms (median of {args.repeat})")
    print(f"ratio reader / baseline {r / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
