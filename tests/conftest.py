"""Fixtures shared by every test room."""

from __future__ import annotations

import os
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


# The modules that take longest (real Ray heads, TRL training, a wheel build, Chromium, the
# agent CLIs), heaviest first, with a rough weight in seconds. Work stealing (scripts/test)
# hands each worker one contiguous range of the collection and steals from a range's end, so a
# heavy module left at the end of the collection ran alone on one worker while the others
# idled. Each one is put at the head of the range of the worker with the least weight so far,
# whole (its module-scoped fixtures, e.g. a Ray head, start once), and the rest are dealt in
# turn, so no worker's range is all acceptance tests.
_HEAVY = {
    "test_training.py": 420,
    "test_ray.py": 300,
    "test_agents.py": 200,
    "test_world.py": 150,
    "test_dashboard.py": 150,
    "test_packaging.py": 120,
    "test_agents_other_clis.py": 100,
    "test_notebooks.py": 80,
    "test_epics.py": 60,
    "test_knowledge.py": 60,
    "test_postgres_engines.py": 60,
    "test_supervisor.py": 60,
    "test_store_outage.py": 100,
    "test_http_api.py": 60,
    "test_json_schemas.py": 60,
    "test_events.py": 60,
    "test_remote_cli.py": 40,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2 or not items:
        return
    heavy: dict[str, list[pytest.Item]] = {}
    light: list[pytest.Item] = []
    for item in items:
        name = item.path.name
        if name in _HEAVY and item.path.parent.name == "acceptance":
            heavy.setdefault(name, []).append(item)
        else:
            light.append(item)
    ranges: list[list[pytest.Item]] = [[] for _ in range(workers)]
    weight = [0] * workers
    for name in sorted(heavy, key=lambda n: -_HEAVY[n]):
        w = weight.index(min(weight))
        ranges[w].extend(heavy[name])
        weight[w] += _HEAVY[name]
    sizes: list[int] = []  # the scheduler's split: what is left // the workers left, in order
    for i in range(workers):
        sizes.append((len(items) - sum(sizes)) // (workers - i))
    turn = 0
    for item in light:  # dealt in turn, so each worker has its share of every room's tests
        while len(ranges[turn]) >= sizes[turn] and any(
            len(r) < n for r, n in zip(ranges, sizes, strict=True)
        ):
            turn = (turn + 1) % workers
        ranges[turn].append(item)
        turn = (turn + 1) % workers
    ordered = [item for r in ranges for item in r]
    items[:] = ordered
