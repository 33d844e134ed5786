"""Bad input gets one clear line on stderr and a non-zero exit code; nothing half-written."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.conftest import Corral


def _one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.parametrize(("args", "needles"), [
    (("--role", "nope", "--", "true"), ("unknown role 'nope'", "default")),
    (("--env", "mars", "--", "true"), ("unknown environment 'mars'",)),
    (("--priority", "9", "--", "true"), ("priority must be 0",)),
    (("--",), ("empty command",)),
    (("--max-attempts", "0", "--", "true"), ("max attempts must be 1",)),
    (("--timeout", "-1", "--", "true"), ("timeout must be positive",)),
    (("--cwd", "/no/such/dir", "--", "true"), ("working directory does not exist",)),
    (("--setenv", "NOEQUALS", "--", "true"), ("NAME=VALUE",)),
])
def test_bad_submissions_are_refused_and_nothing_is_written(
        corral: Corral, args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    _one_line_error(corral.run("submit", *args), 2, *needles)
    assert corral.json("jobs") == []


@pytest.mark.parametrize(("args", "needles"), [
    (("budget", "set", "--usd", "5"), ("no such option: --usd", "`corral budget set --help`")),
    (("kill-switch", "on"), ("missing option '--reason'", "`corral kill-switch on --help`")),
    (("show",), ("missing argument 'job'",)),
    (("jobs", "--limit", "0"), ("'--limit'",)),
    (("nosuch",), ("no such command 'nosuch'", "`corral --help`")),
])
def test_usage_errors_are_one_line_too(corral: Corral, args: tuple[str, ...],
                                       needles: tuple[str, ...]) -> None:
    _one_line_error(corral.run(*args), 2, *needles)


def test_a_group_without_its_command_prints_its_help(corral: Corral) -> None:
    r = corral.run("budget")
    assert r.returncode == 2 and "set" in r.stderr and "status" in r.stderr, r.stderr


@pytest.mark.parametrize(("text", "needles"), [
    ("roles:\n  a: {concurrency: 0}\n", ("roles.a.concurrency: must be at least 1",)),
    ("roles:\n  a: [1\n", ("malformed YAML", "line")),
    ("rolez: {}\n", ("rolez: unknown key (did you mean 'roles'?",)),
    ("- a list\n", ("top level must be a mapping",)),
    ("environments:\n  gpu: {kind: ray}\n", ("environments.gpu.address",)),
])
def test_invalid_config_names_the_key_and_why(corral: Corral, text: str,
                                              needles: tuple[str, ...]) -> None:
    corral.config.write_text(text)
    _one_line_error(corral.run("jobs"), 2, str(corral.config), *needles)


def test_second_engine_on_one_data_dir_is_refused(corral: Corral) -> None:
    first = corral.serve()
    assert corral.wait(corral.submit("true")) == 0  # the first engine is up and working
    _one_line_error(corral.run("serve"), 6, "already serving", str(first.pid))


def test_unreachable_database(corral: Corral) -> None:
    env = corral.env()
    env["CORRAL_STORE_URL"] = "postgresql://postgres@127.0.0.1:1/test"
    r = subprocess.run([sys.executable, "-m", "corral", "jobs"], env=env, capture_output=True,
                       text=True, timeout=30)
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
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)]).returncode:
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
