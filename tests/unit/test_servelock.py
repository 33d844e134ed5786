"""The data directory's engine lock (runtime/servelock.py): one engine per directory, a private
file naming its holder, and `corral serve` holding it before the engine's machinery loads."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from corral.domain.errors import EngineRunning
from corral.runtime.servelock import ServeLock, engine_holds


def test_one_holder_named_in_a_private_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert not engine_holds(data)
    first = ServeLock(data)
    first.acquire()
    try:
        assert first.held and engine_holds(data)
        assert (data / "engine.lock").read_text() == str(os.getpid())
        assert stat.S_IMODE(os.stat(data / "engine.lock").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
        second = ServeLock(data)
        with pytest.raises(EngineRunning, match=f"pid {os.getpid()}"):
            second.acquire()
        assert not second.held
    finally:
        first.release()
    assert not first.held and not engine_holds(data)
    again = ServeLock(data)  # released: the next engine takes it, the pid rewritten
    again.acquire()
    again.release()


def test_serve_holds_the_lock_before_it_loads_the_engine(tmp_path: Path) -> None:
    """A second `corral serve` is refused before `corral.runtime.engine` is imported: the lock
    is the first thing serve takes, so a `submit --wait` just after `serve &` sees it."""
    data = tmp_path / "data"
    held = ServeLock(data)
    held.acquire()
    try:
        probe = (
            "import sys\n"
            "from corral.main import main\n"
            "try:\n"
            "    main()\n"
            "except SystemExit as e:\n"
            "    print(e.code, 'corral.runtime.engine' in sys.modules)\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", probe, "serve", "--no-http", "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
        )
    finally:
        held.release()
    assert "already serving" in r.stderr, r.stderr
    assert r.stdout.split() == ["6", "False"], (r.stdout, r.stderr)
