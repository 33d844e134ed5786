"""Bad input gets one clear line on stderr and a non-zero exit code; nothing half-written."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from corral.runtime.control import poke, socket_path
from corral.workers.agents.base import governance_socket
from tests.acceptance.conftest import CORRAL, Corral
from tests.acceptance.corewire import CoreProcess, job
from tests.helpers import ask_socket


def _one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--role", "nope", "--", "true"), ("unknown role 'nope'", "default")),
        (("--env", "mars", "--", "true"), ("unknown environment 'mars'",)),
        (("--priority", "9", "--", "true"), ("priority must be 0",)),
        (("--",), ("empty command",)),
        (("--max-attempts", "0", "--", "true"), ("max attempts must be 1",)),
        (("--timeout", "-1", "--", "true"), ("timeout must be a finite number of seconds > 0",)),
        (("--timeout", "inf", "--", "true"), ("timeout must be a finite number", "got inf")),
        (("--timeout", "nan", "--", "true"), ("timeout must be a finite number", "got nan")),
        (("--timeout", "1e308", "--", "true"), ("timeout must be", "≤ 2592000", "got 1e+308")),
        (("--grace", "-1", "--", "true"), ("grace must be a finite number of seconds ≥ 0",)),
        (("--grace", "inf", "--", "true"), ("grace must be a finite number",)),
        (("--max-attempts", "1000", "--", "true"), ("max attempts must be 1 … 100",)),
        (("--max-tool-calls", "-1", "--", "true"), ("max tool calls must be 0 … 1000000",)),
        (("--token-budget-in", "-5", "--", "true"), ("token budget in must be 0 …",)),
        (("--token-budget-out", "-5", "--", "true"), ("token budget out must be 0 …",)),
        (("--role", "", "--", "true"), ("role must not be empty",)),
        (("--env", " ", "--", "true"), ("environment must not be empty",)),
        (("--env", "", "--", "true"), ("environment must not be empty",)),
        (
            ("--prompt-file", "/no/such/file", "--", "true"),
            ("--prompt-file: cannot read /no/such/file",),
        ),
        (("--prompt", "a", "--prompt-file", "-"), ("--prompt or --prompt-file, not both",)),
        (("--cwd", "/no/such/dir", "--", "true"), ("working directory does not exist",)),
        (("--setenv", "NOEQUALS", "--", "true"), ("NAME=VALUE",)),
        (("--training", "sft"), ("needs --training sft|dpo|grpo and --script",)),
        (("--training", "ppo", "--script", "t.py"), ("one of sft, dpo, grpo", "'ppo'")),
        (("--model", "m", "--", "true"), ("go with --training",)),
        (
            ("--training", "sft", "--script", "t.py", "--notebook", "n.ipynb"),
            ("--notebook or --training, not both",),
        ),
        (
            ("--training", "sft", "--script", "t.py", "--watch", "loss"),
            ("--watch goes with --compare-to",),
        ),
    ],
)
def test_bad_submissions_are_refused_and_nothing_is_written(
    corral: Corral, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    _one_line_error(corral.run("submit", *args), 2, *needles)
    assert corral.json("jobs") == []


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("budget", "set", "--usd", "5"), ("no such option: --usd", "`corral budget set --help`")),
        (("kill-switch", "on"), ("missing option '--reason'", "`corral kill-switch on --help`")),
        (("show",), ("missing argument 'job'",)),
        (("jobs", "--limit", "0"), ("'--limit'",)),
        (("nosuch",), ("no such command 'nosuch'", "`corral --help`")),
    ],
)
def test_usage_errors_are_one_line_too(
    corral: Corral, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    _one_line_error(corral.run(*args), 2, *needles)


def test_a_group_without_its_command_prints_its_help(corral: Corral) -> None:
    r = corral.run("budget")
    assert r.returncode == 2 and "set" in r.stderr and "status" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("roles:\n  a: {concurrency: 0}\n", ("roles.a.concurrency: must be at least 1",)),
        ("roles:\n  a: [1\n", ("malformed YAML", "line")),
        ("rolez: {}\n", ("rolez: unknown key (did you mean 'roles'?",)),
        ("- a list\n", ("top level must be a mapping",)),
        ("environments:\n  gpu: {kind: ray}\n", ("environments.gpu.address",)),
        ("roles: " + "[" * 100_000 + "]" * 100_000 + "\n", ("line 1: nested deeper than 64",)),
        (
            "roles:\n  a: {limits: {timeout_s: .inf}}\n",
            ("roles.a.limits.timeout_s: must be a finite number",),
        ),
        (
            "roles:\n  a: {limits: {timeout_s: 1e308}}\n",
            ("roles.a.limits.timeout_s: must be at most 2592000",),
        ),
        (
            "engine: {socket_group: no-such-group-here}\n",
            ("engine.socket_group: no such group 'no-such-group-here'",),
        ),
    ],
)
def test_invalid_config_names_the_key_and_why(
    corral: Corral, text: str, needles: tuple[str, ...]
) -> None:
    corral.config.write_text(text)
    _one_line_error(corral.run("jobs"), 2, str(corral.config), *needles)


def test_second_engine_on_one_data_dir_is_refused(corral: Corral) -> None:
    first = corral.serve()
    assert corral.wait(corral.submit("true")) == 0  # the first engine is up and working
    _one_line_error(corral.run("serve"), 6, "already serving", str(first.pid))


def test_unreachable_database(corral: Corral) -> None:
    env = corral.env()
    env["CORRAL_STORE_URL"] = "postgresql://postgres@127.0.0.1:1/test"
    r = subprocess.run(
        [sys.executable, "-m", "corral", "jobs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    _one_line_error(r, 3, "cannot reach PostgreSQL", "Connection refused")


def test_locked_sqlite(corral: Corral) -> None:
    corral.config.write_text("store: {sqlite_busy_timeout_ms: 200}\n")
    corral.ok("jobs")  # creates the database
    holder = sqlite3.connect(corral.data / "corral.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        _one_line_error(corral.run("submit", "--", "true"), 3, "locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert corral.json("jobs") == []


def test_full_disk(tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.fail("this test needs to mount a small tmpfs (run as root)")
    try:
        c = Corral(mnt)
        first = c.submit("true")  # schema and one job fit
        big = "x" * 120_000  # one submission that cannot fit: 6 × 120 KB of environment
        r = c.run("submit", *(f"--setenv=BIG{i}={big}" for i in range(6)), "--", "true")
        _one_line_error(r, 3, "disk full")
        assert [j["id"] for j in c.json("jobs")] == [first]  # nothing half-written
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_bad_input_never_halts_the_engine(corral: Corral) -> None:
    engine = corral.serve()
    for bad in (
        ("--timeout", "inf"),
        ("--timeout", "nan"),
        ("--timeout", "1e308"),
        ("--grace", "-1"),
        ("--role", ""),
        ("--max-attempts", "-3"),
    ):
        _one_line_error(corral.run("submit", *bad, "--", "true"), 2)

    # A deeply nested request under the line limit, on each of the engine's sockets: an error
    # answer, never a RecursionError that ends the engine.
    deep = b'{"op": "ping", "x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}\n"
    answer = json.loads(ask_socket(socket_path(corral.data), deep))
    assert answer == {
        "ok": False,
        "error": "malformed request: JSON nested 30001 levels deep (at most 128)",
    }
    hook = ask_socket(
        governance_socket(corral.data),
        b'{"attempt": "x.1", "token": "t"}\n' + b"[" * 200_000 + b"]" * 200_000,
    )
    assert hook == b"2\ncorral: tool call denied: malformed governance request"

    assert engine.poll() is None and poke(corral.data, "ping") is not None
    assert corral.wait(corral.submit("true")) == 0  # the next job runs
    assert "Traceback" not in corral.engine_log() and "RecursionError" not in corral.engine_log()


def test_the_core_answers_bad_input_and_keeps_serving(corral: Corral, tmp_path: Path) -> None:
    core = CoreProcess(corral)
    try:
        assert core.recv()["type"] == "hello"
        deep = b'{"type": "heartbeat", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
        core.send_raw(deep)  # ~200 KB, under the 1 MiB line limit
        error = core.recv()
        assert error["type"] == "error" and "nested 100001 levels deep" in error["error"]
        for limits in (
            {"timeout_s": float("inf")},
            {"timeout_s": float("nan")},
            {"timeout_s": 1e308},
            {"grace_s": -1},
            {"max_attempts": 10**9},
        ):
            j = job("J", str(tmp_path), ["true"], **limits)  # json writes Infinity and NaN
            reply = core.ask({"type": "request_permit", "job": j, "attempt": 1})
            assert reply["type"] == "error" and "invalid job" in reply["error"], reply
        reply = core.ask(
            {"type": "control", "op": "report_metric", "name": "queue_depth", "value": float("nan")}
        )
        assert reply["type"] == "error" and "must be a finite number" in reply["error"], reply
        beat = core.ask({"type": "heartbeat", "seq": 1})
        assert beat["type"] == "heartbeat"
        permit = core.ask(
            {"type": "request_permit", "job": job("K", str(tmp_path), ["true"]), "attempt": 1}
        )
        assert permit["type"] == "permit", permit  # a sane job still gets its permit
    finally:
        assert core.close() == 0


def test_a_long_prompt_from_a_file_or_stdin(corral: Corral, tmp_path: Path) -> None:
    corral.config.write_text("roles:\n  agent: {worker: claude-code}\n")
    prompt = "Summarise this log:\n" + "line of a long log\n" * 12_000  # 220 KB: over the
    path = tmp_path / "prompt.txt"  # argv limit of one argument
    path.write_text(prompt)
    first = corral.ok("submit", "--role", "agent", "--prompt-file", str(path)).strip()
    assert corral.job(first)["prompt"] == prompt
    r = subprocess.run(
        [CORRAL, "submit", "--role", "agent", "--prompt-file", "-"],
        env=corral.env(),
        input=prompt,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=corral.work,
    )
    assert r.returncode == 0, r.stderr
    assert corral.job(r.stdout.strip())["prompt"] == prompt
    path.write_text("x" * (512 * 1024 + 1))
    _one_line_error(
        corral.run("submit", "--role", "agent", "--prompt-file", str(path)),
        2,
        "over the 524288-byte prompt limit",
    )


@pytest.mark.parametrize("stored", ["1e308", "9e999", "-5"])  # 9e999: SQLite's infinity
def test_a_job_row_out_of_bounds_is_denied_and_the_engine_serves_on(
    corral: Corral, stored: str
) -> None:
    """A row written past the submission's checks (by hand, or by an older version): the core
    refuses it, the job is DENIED saying why, and the next job runs."""
    bad = corral.submit("true")
    db = sqlite3.connect(corral.data / "corral.db", isolation_level=None)
    try:
        db.execute(f"UPDATE jobs SET timeout_s = {stored} WHERE id = ?", (bad,))
    finally:
        db.close()
    engine = corral.serve()
    assert corral.wait(bad) != 0
    job = corral.job(bad)
    assert job["state"] == "DENIED", job
    assert "invalid_job" in job["last_error"] and "timeout must be" in job["last_error"]
    assert corral.wait(corral.submit("true")) == 0
    assert engine.poll() is None
