"""domain/bounds.py: every number finite and within its bounds, every nesting bounded."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest

from corral.core import protocol as p
from corral.domain import bounds
from corral.domain.bounds import BoundError
from corral.domain.errors import InvalidRequest
from corral.domain.models import Limits
from corral.runtime.peers import job_marks
from corral.workers import process
from tests.helpers import eventually


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "]]"]', 1),  # brackets inside strings do not count
        (r'["a\"[[[", "\\", [[]]]', 3),  # nor after an escaped quote; `\\"` closes the string
        ("[" * 5000 + "]" * 5000, 5000),
    ],
)
def test_json_depth_counts_nesting_outside_strings(text: str, depth: int) -> None:
    assert bounds.json_depth(text) == depth
    assert bounds.json_depth(text.encode()) == depth


def test_a_deep_json_text_is_refused_before_parsing() -> None:
    line = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError
    with pytest.raises(BoundError, match="nested 100000 levels deep"):
        bounds.loads_bounded(line)
    ok = "[" * bounds.MAX_JSON_DEPTH + "]" * bounds.MAX_JSON_DEPTH
    assert bounds.loads_bounded(ok) is not None
    # many brackets, shallow, or inside strings: what counts is the nesting
    wide = "[" + ",".join(["[]"] * 1000) + "]"
    assert len(bounds.loads_bounded(wide.encode())) == 1000
    assert bounds.loads_bounded(f'["{"[" * 1000}"]') == ["[" * 1000]
    over = "[" * (bounds.MAX_JSON_DEPTH + 1) + "]" * (bounds.MAX_JSON_DEPTH + 1)
    with pytest.raises(BoundError, match=f"nested {bounds.MAX_JSON_DEPTH + 1} levels deep"):
        bounds.loads_bounded(over.encode())


def test_the_core_protocol_answers_a_deep_line_with_an_error() -> None:
    deep = b'{"type": "heartbeat", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert len(deep) < p.MAX_LINE
    with pytest.raises(p.ProtocolError, match="nested"):
        p.decode(deep)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308, 0, -1, "x", None])
def test_a_timeout_must_be_finite_positive_and_bounded(value: object) -> None:
    with pytest.raises(BoundError, match="timeout must be a finite number of seconds > 0"):
        bounds.number(
            "timeout", value, low=0, high=bounds.MAX_TIMEOUT_S, low_open=True, unit="seconds"
        )


def test_limits_are_checked_field_by_field() -> None:
    assert bounds.check_limits(Limits()) == Limits()
    for bad, needle in [
        (Limits(timeout_s=math.nan), "timeout"),
        (Limits(grace_s=-1), "grace"),
        (Limits(grace_s=math.inf), "grace"),
        (Limits(max_attempts=0), "max attempts"),
        (Limits(max_tool_calls=-1), "max tool calls"),
        (Limits(token_budget_in=-5), "token budget in"),
        (Limits(token_budget_out=10**13), "token budget out"),
    ]:
        with pytest.raises(InvalidRequest, match=needle):
            bounds.check_limits(bad)


def test_limits_on_the_core_protocol_are_checked_too() -> None:
    wire = {
        "id": "J",
        "state": "QUEUED",
        "role": "default",
        "worker": "command",
        "env_name": "local",
        "priority": 2,
        "tenant": "t",
        "command": ["true"],
        "limits": {"timeout_s": math.inf},
        "created_at": 1.0,
        "updated_at": 1.0,
        "sort_at": 1.0,
    }
    with pytest.raises(p.ProtocolError, match="invalid job: timeout must be a finite"):
        p.job_in(json.loads(json.dumps(wire)))  # Python's json reads `Infinity`


@pytest.mark.parametrize("value", [-0.01, math.inf, math.nan, 2e9])
def test_money_is_finite_and_not_negative(value: float) -> None:
    with pytest.raises(BoundError, match="--ceiling-usd must be a finite number of USD"):
        bounds.usd("--ceiling-usd", value)
    assert bounds.usd("--ceiling-usd", 12.5) == 12.5


def test_blank_names_are_refused() -> None:
    with pytest.raises(BoundError, match="role must not be empty"):
        bounds.text("role", " ")
    assert bounds.text("role", "default") == "default"


def test_a_deep_yaml_flow_sequence_is_found_without_recursing() -> None:
    text = "roles: " + "[" * 100_000 + "]" * 100_000 + "\n"
    assert (
        bounds.yaml_too_deep(text) == f"line 1: nested deeper than {bounds.MAX_YAML_DEPTH} levels"
    )
    assert bounds.yaml_too_deep("roles:\n  a: {concurrency: 1}\n") is None
    assert bounds.yaml_too_deep("roles: [1\n") is None  # malformed: the loader says so


def test_job_marks_find_the_job_of_a_process_that_dropped_its_environment(tmp_path: Path) -> None:
    """A job's process that cleared CORRAL_JOB_ID is still found through its parent."""
    env = {"PATH": os.environ["PATH"], "CORRAL_JOB_ID": "J-1"}
    parent = subprocess.Popen(["sh", "-c", "env -i sleep 30; true"], env=env)
    try:
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
        eventually(lambda: children.read_text().split(), what="sh to start sleep")
        child = int(children.read_text().split()[0])
        eventually(
            lambda: Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"),
            what="the child to exec sleep",
        )
        assert b"CORRAL_JOB_ID" not in Path(f"/proc/{child}/environ").read_bytes()
        assert job_marks(child) == ["J-1"]
    finally:
        parent.kill()
        parent.wait()


def test_a_process_that_left_its_session_and_environment_is_its_jobs_by_its_cgroup(
    tmp_path: Path,
) -> None:
    """setsid + env -i + a double fork, then its shim SIGKILLed: nothing in the environment or
    the ancestry names the job any more; the attempt's cgroup, which the kernel keeps, still
    does (where the host gives attempts a cgroup: this machine does, and CI runs on one like
    it)."""
    assert process.cgroup_base() is not None, "this host gives attempts no cgroup"
    pidfile = tmp_path / "escapee.pid"
    proc = process.spawn(
        attempt_dir=tmp_path / "J-9.1",
        cwd=None,
        grace_s=1.0,
        deadline_epoch_s=None,
        env={"PATH": os.environ["PATH"], "CORRAL_JOB_ID": "J-9"},
        argv=[
            "sh",
            "-c",
            f"(setsid env -i sh -c 'echo $$ > {pidfile}; exec sleep 30' &); sleep 30",
        ],
    )
    try:
        escapee = int(
            eventually(
                lambda: pidfile.exists() and pidfile.read_text().strip(),
                what="the escapee to write its pid",
            )
        )
        eventually(
            lambda: Path(f"/proc/{escapee}/cmdline").read_bytes().startswith(b"sleep"),
            what="the escapee to exec sleep",
        )
        os.kill(proc.pid, signal.SIGKILL)  # the shim, its subreaper, is gone
        eventually(
            lambda: (
                Path(f"/proc/{escapee}/stat").read_text().rsplit(")", 1)[1].split()[1]
                != str(proc.pid)
            ),
            what="the escapee to be reparented",
        )
        assert b"CORRAL_JOB_ID" not in Path(f"/proc/{escapee}/environ").read_bytes()
        assert job_marks(escapee) == ["J-9"]
        with pytest.MonkeyPatch.context() as mp:  # the environment and ancestry alone lose it
            mp.setattr("corral.runtime.peers.cgroup_job", lambda pid: None)
            assert job_marks(escapee) == []
    finally:
        process.sweep(proc.attempt_dir)
