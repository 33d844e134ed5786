"""Notebook jobs: `corral submit --notebook` and the API's `{source, environment}` body.

A notebook job is a command job whose command is the notebook runner (workers/notebook.py):
on a local environment it runs under the shim, on a Ray environment as a Ray job, the same
command in both. The notebook, its parameters and where it is copied back are recorded on the
job (`options.notebook`), so `corral show` and the API tell what ran.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.domain.errors import InvalidRequest
from corral.services.submissions import SubmitRequest

MAX_PARAMS = 100


def parse_params(pairs: Sequence[str]) -> dict[str, Any]:
    """NAME=VALUE pairs: a value that parses as JSON is that value, else the string."""
    if len(pairs) > MAX_PARAMS:
        raise InvalidRequest(f"at most {MAX_PARAMS} notebook parameters, got {len(pairs)}")
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise InvalidRequest(f"--param wants NAME=VALUE with NAME a Python name, got {pair!r}")
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out


def notebook_request(
    base: SubmitRequest,
    source: str,
    *,
    params: Mapping[str, Any],
    copyback: str | None = None,
    hook_command: str | None = None,
    hook_url: str | None = None,
    cell_timeout_s: float | None = None,
    kernel: str = "python3",
    python: str | None = None,
) -> SubmitRequest:
    """`base` (role, environment, limits …) made a notebook job running `source`. Relative paths
    are taken from the request's working directory."""
    if not source.endswith(".ipynb"):
        raise InvalidRequest(f"a notebook is an .ipynb file, got {source!r}")
    if hook_command and hook_url:
        raise InvalidRequest("give one copyback hook: a command or a URL, not both")
    if (hook_command or hook_url) and not copyback:
        raise InvalidRequest("a copyback hook needs --copyback DIR")
    where = Path(base.cwd or ".")
    src = str((where / source).resolve())
    dest = str((where / copyback).resolve()) if copyback else None
    command = [python or sys.executable, "-m", "corral.workers.notebook", "--input", src]
    command += ["--kernel", kernel]
    for name, value in params.items():
        command += ["--param", f"{name}={json.dumps(value)}"]
    if dest:
        command += ["--copyback", dest]
    if hook_command:
        command += ["--hook-command", hook_command]
    if hook_url:
        command += ["--hook-url", hook_url]
    if cell_timeout_s is not None:
        command += ["--cell-timeout", f"{cell_timeout_s:g}"]
    record: dict[str, Any] = {"source": src, "parameters": dict(params), "kernel": kernel}
    if dest:
        record["copyback"] = dest
    return replace(base, command=tuple(command), prompt=None, worker="command", notebook=record)


def intent_request(
    base: SubmitRequest,
    source: str,
    environment: str | None,
    parameters: Mapping[str, Any],
    copyback: str | None,
) -> SubmitRequest:
    """The API's notebook body (`{source, environment}`): `source` is the notebook's path,
    absolute or relative to the body's `cwd`."""
    if base.command or base.prompt:
        raise InvalidRequest("a notebook intent has a source, not a command or a prompt")
    if not Path(source).is_absolute() and not base.cwd:
        raise InvalidRequest("a relative notebook source needs the body's cwd")
    for name in parameters:
        if not name.isidentifier():
            raise InvalidRequest(f"notebook parameter {name!r} is not a Python name")
    if environment is not None:
        base = replace(base, env_name=environment)
    return notebook_request(base, source, params=parameters, copyback=copyback)
