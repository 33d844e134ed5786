"""The data directory is its user's alone: created private, narrowed when found open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.domain.errors import ConfigError
from corral.policy.redact import Redactor
from corral.workers.privacy import scrub_tree, secure_data_dir


def modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.lstat().st_mode & 0o777
        for p in [root, *root.rglob("*")]
        if not p.is_symlink()
    }


def test_a_new_data_directory_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        assert secure_data_dir(tmp_path / "a" / "data") is None
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "data").stat().st_mode & 0o777 == 0o700


def test_an_open_data_directory_is_narrowed_once_with_a_warning(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "attempts" / "j.1").mkdir(parents=True)
    (data / "corral.db").write_text("x")
    (data / "attempts" / "j.1" / "stdout.log").write_text("x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not ours")
    (data / "link").symlink_to(elsewhere)
    for p in (data, data / "attempts", data / "attempts" / "j.1"):
        p.chmod(0o777)
    for p in (data / "corral.db", data / "attempts" / "j.1" / "stdout.log", elsewhere):
        p.chmod(0o644)
    warning = secure_data_dir(data)
    assert warning is not None and "narrowed 5 entries" in warning
    assert modes(data) == {
        ".": 0o700,
        "attempts": 0o700,
        "attempts/j.1": 0o700,
        "corral.db": 0o600,
        "attempts/j.1/stdout.log": 0o600,
    }
    assert elsewhere.stat().st_mode & 0o777 == 0o644  # a symlink's target is not followed
    assert secure_data_dir(data) is None  # nothing to say the second time


def test_a_data_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 65534, 65534)  # the tests run as root (as CI does): nobody's directory
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        secure_data_dir(data)


def test_corral_processes_run_private_and_jobs_get_the_umask_back() -> None:
    code = (
        "import os; from corral.workers import privacy; privacy.make_private(); "
        "print(oct(os.umask(0)), oct(privacy.job_umask()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", f"import os; os.umask(0o002); {code}"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "CORRAL_JOB_UMASK"},
    )
    assert out.stdout.split() == ["0o77", "0o2"]


def test_a_tree_is_masked_in_place_at_the_same_length(tmp_path: Path) -> None:
    secret = "corral-canary-scrub-3a9d"
    key = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "node_modules").mkdir()
    line = f'{{"text": "use {secret} and {key}", "n": 3}}\n'.encode()
    session = home / "projects" / "s.jsonl"
    session.write_bytes(line * 3)
    session.chmod(0o666)
    lib = home / "node_modules" / "lib.js"
    lib.write_text(f'const k = "{key}";')  # code the CLI runs is left as it is
    big = home / "big.log"  # a secret across the boundary of two chunks is masked whole
    with big.open("wb") as f:
        f.write(b"x" * ((8 << 20) - 5))
        f.write(secret.encode() + b"\n")
    assert scrub_tree(home, Redactor([secret])) == 2
    masked = session.read_bytes()
    assert len(masked) == len(line) * 3 and secret.encode() not in masked
    assert key.encode() not in masked and b"*" * len(secret) in masked
    assert [row.count(b'"') for row in masked.splitlines()] == [6, 6, 6]  # still JSON-shaped
    assert session.stat().st_mode & 0o777 == 0o600
    assert key in lib.read_text()
    assert secret.encode() not in big.read_bytes()


def test_an_empty_data_directory_made_open_is_narrowed_without_a_word(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    assert secure_data_dir(data) is None
    assert data.stat().st_mode & 0o777 == 0o700
