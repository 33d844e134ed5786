"""W1 with the world model's detectors on against W1 with them off, in the same run.

    .venv/bin/python bench/detectors.py [--jobs N] [--repeat N] [--core default|process|inline]

Runs W1 (`/bin/true` jobs, concurrency 8, the engine already serving: bench/run.py's `live`
mode) alternately with `scheduler.world_watch: false` (no deadlock and anomaly watch, no
anomaly baselines learned from ended attempts) and with it on (the default: the watch looks
every scheduler tick, each ended attempt adds to its baselines), `--repeat` times each, and
prints the median jobs/s of each and their ratio (on / off; the aim is ≥ 0.97). Nothing is
asserted: timing on a shared machine is for reading.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/run.py

from bench import run as w1

from corral.config import Config, load

_plain_config = w1.write_config


def _watch_off(data: Path, concurrency: int, core: str) -> Config:
    cfg = _plain_config(data, concurrency, core)
    assert cfg.source is not None
    cfg.source.write_text(cfg.source.read_text() + "scheduler:\n  world_watch: false\n")
    return load(data_dir=data, config_path=cfg.source)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--core", choices=w1.CORES, default="default", help="as bench/run.py's")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-bench-detectors-"))
    wl = w1.Workload("W1", args.jobs, 8, "/bin/true", w1._true)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(args.repeat):
            for label in ("off", "on") if i % 2 == 0 else ("on", "off"):
                work = root / f"{label}-{i}"
                work.mkdir()
                w1.write_config = _watch_off if label == "off" else _plain_config
                stats = w1.run_corral_live(wl, work, w1.Options(core=args.core))
                rates[label].append(stats.jobs_per_s)
                print(
                    f"round {i + 1} detectors {label:<3}: {stats.jobs_per_s:7.1f} jobs/s"
                    f" ({stats.failed} not succeeded)",
                    flush=True,
                )
    finally:
        w1.write_config = _plain_config
        shutil.rmtree(root, ignore_errors=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(
        f"W1 {args.jobs} jobs: detectors off {off:.1f} jobs/s, on {on:.1f} jobs/s, "
        f"ratio on/off {on / off if off else 0:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
