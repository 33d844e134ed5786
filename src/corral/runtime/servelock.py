"""`<data dir>/engine.lock`: at most one engine per data directory, and how others tell one is
there. Small on purpose: `corral serve` takes the lock before it imports the engine's machinery,
so a `corral submit --wait` started right after `corral serve &` sees an engine at once."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from corral.domain.errors import EngineRunning


class ServeLock:
    """An flock held for the engine's life; the file names the holder's pid."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "engine.lock"
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        f = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), "r+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.read().strip() or "?"
            f.close()
            raise EngineRunning(
                f"another engine (pid {holder}) is already serving {self.path.parent}"
            ) from None
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def engine_holds(data_dir: Path) -> bool:
    """Whether a process holds `<data dir>/engine.lock`, read from /proc/locks: testing it by
    taking the lock, even shared, could make a starting engine believe another one serves the
    directory."""
    try:
        st = os.stat(data_dir / "engine.lock")
        with open("/proc/locks") as f:
            table = f.read()
    except OSError:
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(
        len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == where
        for parts in (line.split() for line in table.splitlines())
    )
