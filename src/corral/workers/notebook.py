"""The notebook runner: executes a notebook with papermill and copies the result back.

    python -m corral.workers.notebook --input nb.ipynb [--param NAME=JSON …] \
        [--copyback DIR] [--hook-command CMD | --hook-url URL] [--kernel K] [--cell-timeout S]

`corral submit --notebook` makes a job that runs this (services/notebooks.py). On a local
environment the attempt runs it under the shim; on a Ray environment the same command is the
Ray job's entrypoint (workers/raywatch.py), so a notebook runs the same way in both places.

- Parameters are injected after the cell tagged `parameters` (papermill's rule) and recorded in
  the executed notebook's metadata; each value is JSON when it parses as JSON, else a string.
- The executed notebook is written in the attempt's directory and then, also when a cell failed
  or timed out (papermill still writes it), copied to `--copyback DIR` atomically: a temporary
  file in DIR, fsync, rename, fsync of DIR. Its sha256 and the parameters are written beside it
  (`<name>.ipynb.json`) and to the job's log.
- The copyback hook runs after the copy: a command (with CORRAL_NOTEBOOK and
  CORRAL_NOTEBOOK_SHA256 in its environment) or a POST of the same JSON to a URL.
- A failing cell ends the attempt with the notebook's error (cell, ename, evalue) as its error
  (workers/notes.py); a notebook that cannot run at all (no such kernel, unreadable input) is
  the worker's configuration fault and is not retried.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from corral.workers.notes import write_note

EXIT_CELL_FAILED = 1
EXIT_CANNOT_RUN = 78  # the notebook could not be executed at all (configuration)
HOOK_TIMEOUT_S = 60.0


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """NAME=VALUE pairs: a value that parses as JSON is that value, else the string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"a parameter is NAME=VALUE with NAME a Python name, got {pair!r}")
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def copy_atomically(src: Path, dest_dir: Path, name: str) -> Path:
    """`src` as `dest_dir/name`, never seen half written."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=dest_dir)
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as a file the user wrote, not a private temporary one
        os.replace(tmp, dest_dir / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(dest_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return dest_dir / name


def _work_dir() -> Path:
    result = os.environ.get("CORRAL_RESULT_FILE")
    if result and Path(result).parent.is_dir():
        return Path(result).parent
    return Path(tempfile.mkdtemp(prefix="corral-notebook-"))


def execute(
    source: Path, output: Path, params: dict[str, Any], kernel: str, cell_timeout: float | None
) -> tuple[str | None, str | None]:
    """Run the notebook; (error, fault) — (None, None) when every cell ran."""
    import papermill  # the notebook extra, loaded by this process only
    from papermill.exceptions import PapermillExecutionError

    try:
        papermill.execute_notebook(
            str(source),
            str(output),
            parameters=params,
            kernel_name=kernel,
            cwd=str(source.parent),
            progress_bar=False,
            execution_timeout=cell_timeout,
        )
    except PapermillExecutionError as err:
        return f"notebook cell {err.exec_count} failed: {err.ename}: {err.evalue}", "job"
    except Exception as err:  # a cell over its timeout, a kernel that died, a missing kernel
        name = type(err).__name__
        if name in ("CellTimeoutError", "DeadKernelError"):
            return f"notebook {name}: {str(err).strip().splitlines()[0:1]}", "job"
        return f"notebook cannot run ({name}): {err}", "config"
    return None, None


def run_hook(args: argparse.Namespace, record: dict[str, Any]) -> str | None:
    """The copyback hook; a problem in one line, or None."""
    if args.hook_command:
        env = {
            **os.environ,
            "CORRAL_NOTEBOOK": record["path"],
            "CORRAL_NOTEBOOK_SHA256": record["sha256"],
        }
        try:
            done = subprocess.run(
                args.hook_command, shell=True, env=env, timeout=HOOK_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return f"copyback hook timed out after {HOOK_TIMEOUT_S:g}s"
        return None if done.returncode == 0 else f"copyback hook exited {done.returncode}"
    if args.hook_url:
        req = urllib.request.Request(
            args.hook_url,
            data=json.dumps(record).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=HOOK_TIMEOUT_S) as resp:
                resp.read(1024)
        except OSError as err:
            return f"copyback hook {args.hook_url}: {err}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-notebook", description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--param", action="append", default=[])
    parser.add_argument("--copyback")
    parser.add_argument("--hook-command")
    parser.add_argument("--hook-url")
    parser.add_argument("--kernel", default="python3")
    parser.add_argument("--cell-timeout", type=float)
    args = parser.parse_args(argv)
    work = _work_dir()
    source = Path(args.input).resolve()
    params = parse_params(args.param)
    if not source.is_file():
        write_note(work, error=f"notebook {source} does not exist", fault="config")
        print(f"corral-notebook: {source} does not exist", file=sys.stderr)
        return EXIT_CANNOT_RUN
    output = work / source.name
    print(f"corral: executing {source} with {json.dumps(params)}", flush=True)
    error, fault = execute(source, output, params, args.kernel, args.cell_timeout)
    record: dict[str, Any] = {"source": str(source), "parameters": params, "error": error}
    problems = []
    if args.copyback and output.exists():
        dest = copy_atomically(output, Path(args.copyback).resolve(), source.name)
        record.update(path=str(dest), sha256=sha256_of(dest))
        side = json.dumps(record, indent=1)
        (dest.parent / f"{dest.name}.json").write_text(side + "\n")
        print(f"corral: copied back {dest} sha256 {record['sha256']}", flush=True)
        problem = run_hook(args, record)
        if problem:
            problems.append(problem)
    (work / "notebook.json").write_text(json.dumps(record) + "\n")
    if error is not None:
        print(f"corral: {error}", file=sys.stderr, flush=True)
        write_note(work, error=error, fault=fault or "job")
        return EXIT_CANNOT_RUN if fault == "config" else EXIT_CELL_FAILED
    if problems:
        print(f"corral: {problems[0]}", file=sys.stderr, flush=True)
        write_note(work, error=problems[0], fault="job")
        return EXIT_CELL_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
