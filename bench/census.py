"""How many SQLite transactions a job costs: W1's jobs submitted, then run by an engine in this
process (core inline), with every statement counted through SQLite's trace callback.

    .venv/bin/python bench/census.py [--jobs N]

Prints the write transactions (`BEGIN IMMEDIATE`) per job of the submissions and of the
engine's run, and the statements per job. SQLite reports a statement again for each trigger it
fires (the queue-depth triggers of migration 0032), so the statement count is an upper bound;
the transaction counts are exact. Counting does not depend on the machine's speed: run it
against an older checkout (`PYTHONPATH=<git archive of it>/src`) to compare two versions.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/run.py

from bench import run as w1

from corral.runtime.engine import Engine

_connect = sqlite3.connect


def _counting(counts: Counter[str]) -> object:
    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = _connect(*args, **kwargs)  # type: ignore[arg-type]
        conn.set_trace_callback(lambda stmt: counts.update([stmt.lstrip()[:15].upper()]))
        return conn

    return connect


def census(jobs: int) -> dict[str, float]:
    counts: Counter[str] = Counter()
    sqlite3.connect = _counting(counts)  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="corral-census-") as tmp:
            root = Path(tmp)
            wl = w1.Workload("W1", jobs, 8, "/bin/true", w1._true)
            cfg = w1.write_config(root / "data", 8, "inline")
            counts.clear()
            anyio.run(w1._submit, cfg, w1._specs(wl, root), "none")
            submitted = counts["BEGIN IMMEDIATE"]
            counts.clear()
            anyio.run(lambda: Engine(cfg).run(drain=True))
            ran, statements = counts["BEGIN IMMEDIATE"], sum(counts.values())
    finally:
        sqlite3.connect = _connect
    return {
        "submission_write_transactions_per_job": round(submitted / jobs, 2),
        "engine_write_transactions_per_job": round(ran / jobs, 2),
        "engine_statements_per_job_at_most": round(statements / jobs, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    for name, value in census(args.jobs).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
