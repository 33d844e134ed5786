"""Secrets never at rest in clear, private files, and the output cap, through the real `corral`.

Canaries are planted in the argv, the environment, the prompt, the stdout and the stderr of a
command job and of an agent job (the real Claude Code CLI against the scripted model stand-in);
afterwards not one of them is found in any file under the data directory (the SQLite database
and its WAL included, the agent's private home included), in the database's rows, or in the
output of any reporting command. Everything runs under umask 000, and every file and directory
Corral created is private all the same.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents import agent_config, bash
from tests.agentmock import AnthropicMock

SHAPE = "sk-ant-api03-corralCanaryShape0123456789abcd"  # a credential nobody declared
NAMED = "corral-canary-named-c41d07"  # --setenv DEPLOY_TOKEN=…: named like a secret
MARKED = "corral-canary-marked-9e2b55"  # --setenv PLAIN=… --secret-env PLAIN
ENGINE = "corral-canary-engine-17fa30"  # --secret-env FROM_ENGINE: the engine's own variable
PROMPT = "corral-canary-prompt-6b8e44"  # in an agent's prompt; --setenv AGENT_API_KEY=… too
CANARIES = (SHAPE, NAMED, MARKED, ENGINE, PROMPT)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)  # every process started from here inherits it
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def canary_corral(
    tmp_path: Path, clis: None, open_umask: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Corral, AnthropicMock]]:
    monkeypatch.setenv("FROM_ENGINE", ENGINE)
    monkeypatch.delenv("CORRAL_JOB_UMASK", raising=False)
    mock = AnthropicMock([]).start()
    c = Corral(tmp_path, agent_config(mock.url, tools='["Bash(echo *)", "Bash(printenv *)"]'))
    try:
        yield c, mock
    finally:
        c.stop_all()
        mock.close()


def leaks_in_files(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in CANARIES if s.encode() in data]
    return found


def leaks_in_rows(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    return [s for s in CANARIES if s in dump]


def open_modes(root: Path) -> list[str]:
    """Entries Corral created that others could read, write or enter (an entry that went while
    we looked, such as SQLite's -wal file when the last connection closes, is not one)."""
    found = []
    for p in [root, *root.rglob("*")]:
        try:
            mode = p.lstat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{p} {mode & 0o777:o}")
    return found


def test_canaries_planted_everywhere_are_found_nowhere(
    canary_corral: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = canary_corral
    half = len(NAMED) // 2
    script = (
        f'echo "argv {SHAPE} {NAMED} env $DEPLOY_TOKEN $PLAIN $FROM_ENGINE"; '
        f'echo "err $DEPLOY_TOKEN {SHAPE}" >&2; printf "split {NAMED[:half]}"; '
        f'sleep 0.2; echo "{NAMED[half:]} $PLAIN"'
    )
    command = c.ok(
        "submit",
        "-e",
        f"DEPLOY_TOKEN={NAMED}",
        "-e",
        f"PLAIN={MARKED}",
        "--secret-env",
        "PLAIN",
        "--secret-env",
        "FROM_ENGINE",
        "--",
        "sh",
        "-c",
        script,
    ).strip()
    mock.script[:] = [
        {"tool_calls": [bash(f"echo {PROMPT} {SHAPE}")]},
        {"tool_calls": [bash("printenv AGENT_API_KEY")]},
        {"text": f"Done: {PROMPT} and {NAMED}."},
    ]
    agent = c.ok(
        "submit",
        "--role",
        "agent",
        "--cwd",
        str(c.work),
        "-e",
        f"AGENT_API_KEY={PROMPT}",
        "-e",
        f"DEPLOY_TOKEN={NAMED}",
        "--prompt",
        f"echo {PROMPT} and the key {SHAPE}",
    ).strip()
    c.serve()
    for job in (command, agent):
        c.wait(job, timeout=120)
        assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-3000:]
    # the job itself got the real values: its redacted log shows where they were
    out = c.ok("logs", command)
    assert out == (
        "argv [REDACTED] [REDACTED] env [REDACTED] [REDACTED] [REDACTED]\n"
        "split [REDACTED] [REDACTED]\n"
    )
    assert c.run("logs", command).stderr == "err [REDACTED] [REDACTED]\n"
    # the model saw the real prompt and the tool really printed the values
    assert PROMPT in json.dumps(mock.turn_requests[0]) and SHAPE in json.dumps(mock.turn_requests)
    c.stop_all()

    assert leaks_in_files(c.data) == []
    assert leaks_in_rows(c.data / "corral.db") == []
    shown = []
    for job in (command, agent):
        for args in (
            ("show", job),
            ("show", job, "--json"),
            ("logs", job),
            ("trace", job),
            ("trace", job, "--json"),
            ("report", job),
            ("report", job, "--json"),
        ):
            r = c.run(*args)
            assert r.returncode == 0, (args, r.stderr)
            shown.append(r.stdout + r.stderr)
    for args in (
        ("jobs",),
        ("jobs", "--json"),
        ("events",),
        ("events", "--json"),
        ("runs", "--json"),
        ("incidents", "--json"),
        ("policy", "log", "--json"),
    ):
        r = c.run(*args)
        shown.append(r.stdout + r.stderr)
    assert [s for s in CANARIES if any(s in text for text in shown)] == []
    assert "[REDACTED]" in "".join(shown)
    assert open_modes(c.data) == []


def test_a_flood_without_newlines_stops_at_the_cap_with_head_and_tail_kept(corral: Corral) -> None:
    corral.config.write_text(
        corral.config.read_text() + "output:\n  max_bytes: 1048576\n  tail_bytes: 65536\n"
    )
    code = (
        "import sys\nsys.stdout.write('BEGIN')\n"
        "for _ in range(100 * 16):\n    sys.stdout.write('z' * 65536)\n"
        "sys.stdout.write('END')\n"
    )
    job = corral.submit(sys.executable, "-c", code)
    corral.drain()
    info = corral.job(job)
    [attempt] = info["attempts"]  # not retried: the same job would flood again
    assert (info["state"], info["limit_hit"]) == ("FAILED", "output")
    assert info["last_error"] == "runtime limit reached: output"
    assert (attempt["limit_hit"], attempt["signal"]) == ("output", 15)
    assert attempt["error"].startswith("output cap reached: the job was stopped")
    log = (Path(attempt["log_dir"]) / "stdout.log").read_bytes()
    head, marker, rest = log.partition(b"\n[corral: output cap of 1048576 bytes reached: ")
    assert head.startswith(b"BEGINzzz") and len(head) <= 1 << 20
    assert marker and rest.endswith(b"z" * 1000)  # the last part before the stop
    assert len(log) < (1 << 20) + (1 << 16) + 200  # far from the 100 MB it tried to write


def test_a_secret_variable_the_engine_lacks_fails_the_attempt_with_a_clear_error(
    corral: Corral, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_TEST_NOT_THERE", raising=False)
    job = corral.submit("true", opts=("--secret-env", "CORRAL_TEST_NOT_THERE"))
    corral.drain()
    info = corral.job(job)
    assert info["state"] == "FAILED" and len(info["attempts"]) == 1  # not retried
    assert info["last_error"] == (
        "--secret-env CORRAL_TEST_NOT_THERE: the engine's environment has no CORRAL_TEST_NOT_THERE"
    )
