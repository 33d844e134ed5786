"""Fixtures shared by every test room."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import PgSchemas


@pytest.fixture
def pg_schemas() -> Iterator[PgSchemas]:
    """Fresh PostgreSQL schemas on the test server, dropped after the test."""
    schemas = PgSchemas()
    try:
        yield schemas
    finally:
        schemas.drop_all()


# No test may write into the checkout (a test once left a looping agent's output at the root).
# The controller compares `git status` before and after the session; anything new fails the run.
_CHECKOUT = Path(__file__).resolve().parent.parent


def _checkout_status() -> set[str] | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(_CHECKOUT), "status", "--porcelain", "--untracked-files=all"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (an unpacked sdist): nothing to compare
    return set(out.splitlines())


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the xdist controller, or a plain run
        session.config.stash[_BEFORE] = _checkout_status()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    before = session.config.stash.get(_BEFORE, None)
    after = _checkout_status()
    if before is None or after is None:
        return
    written = sorted(after - before)
    if written:
        lines = "\n  ".join(written)
        sys.stderr.write(
            f"\nThe tests wrote into the checkout (git status):\n  {lines}\n"
            "Write under tmp_path instead.\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set[str] | None]()
