"""Corral's files are its user's alone: 0700 directories, 0600 files, whatever the umask.

Corral's own processes (the `corral` command, the engine, the core) run with umask 077 from the
start (`make_private`), so everything they and SQLite create — the database and its WAL, the
logs, the sockets, the key, the attempt directories — is private to the user. Jobs get back the
umask Corral was started with (`job_umask`): the files a job writes in its workspace are its own
business. A data directory that already exists with wider modes is narrowed, with a warning
(`secure_data_dir`): refusing would strand the jobs and logs it holds over something Corral can
put right itself; a directory that belongs to another user is refused (docs/how-to/secrets.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.domain.errors import ConfigError
from corral.policy.redact import HOLD, Redactor

PRIVATE_UMASK = 0o077
# Corral's processes pass the umask they were started with to the ones they start (the core),
# which begin under 077 already: the umask of the jobs is decided once, by the first.
UMASK_ENV = "CORRAL_JOB_UMASK"


def make_private() -> None:
    """From now on this process creates private files; remember the umask jobs get."""
    started = os.umask(PRIVATE_UMASK)
    os.environ.setdefault(UMASK_ENV, f"{started:03o}")


def job_umask() -> int:
    """The umask a job runs with: the one Corral was started with."""
    value = os.environ.get(UMASK_ENV)
    if value:
        try:
            return int(value, 8) & 0o777
        except ValueError:
            pass
    current = os.umask(PRIVATE_UMASK)
    os.umask(current)
    return current


def secure_data_dir(data_dir: Path) -> str | None:
    """Create the data directory private, or narrow one that is readable or writable by
    others (everything in it, once: the first time it is found open); a warning saying what
    was narrowed, or None. ConfigError when it belongs to another user."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    top = os.stat(data_dir)
    if top.st_uid != os.geteuid():
        raise ConfigError(
            f"data directory {data_dir} belongs to uid {top.st_uid}, not to "
            f"this user ({os.geteuid()}): Corral keeps it private, so it will "
            "not share one"
        )
    inside = [Path(e.path) for e in os.scandir(data_dir)]
    if not inside:  # a directory the operator just made: nothing was exposed, nothing to say
        _narrow(data_dir)
        return None
    if not any(_open(p) for p in (data_dir, *inside)):
        return None
    narrowed, failed = 0, []
    for path in _walk(data_dir):
        try:
            narrowed += _narrow(path)
        except OSError as err:
            failed.append(f"{path}: {err.strerror}")
    message = (
        f"data directory {data_dir} was readable or writable by others: narrowed "
        f"{narrowed} entries to 0700 directories and 0600 files"
    )
    if failed:
        message += f"; could not narrow {len(failed)} (first: {failed[0]})"
    return message


SCRUB_CHUNK = 8 << 20
# Code and package caches the CLI runs from (OpenCode's plugin, npm's cache), not its memory.
SCRUB_SKIP = frozenset({"node_modules", ".cache", ".npm", ".bun"})


def scrub_tree(root: Path, redactor: Redactor) -> int:
    """Mask, in place and at the same length, every secret `redactor` knows in the files under
    `root`, and narrow their modes: for files a job wrote in Corral's data directory (an agent
    CLI's session memory). Same length keeps them valid (JSON, SQLite); in place, a writer
    appending meanwhile loses nothing. Symlinks are not followed. The number of files changed."""
    if not root.is_dir():
        return 0
    changed = 0
    for path in _walk(root, prune=SCRUB_SKIP):
        try:
            _narrow(path)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and _mask(path, st.st_size, redactor):
                changed += 1
        except OSError:  # gone meanwhile, or not ours: nothing to mask there
            continue
    return changed


def _mask(path: Path, size: int, redactor: Redactor) -> bool:
    masked = False
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for offset in range(0, size, SCRUB_CHUNK):  # chunks overlap by HOLD: none is missed
            data = os.pread(fd, SCRUB_CHUNK + HOLD, offset)
            for start, end in redactor.spans(data):
                if start < SCRUB_CHUNK or offset + SCRUB_CHUNK >= size:
                    os.pwrite(fd, b"*" * (end - start), offset + start)
                    masked = True
    finally:
        os.close(fd)
    return masked


def _open(path: Path) -> bool:
    """Whether others have any access to this entry (symlinks have no modes of their own)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return not stat.S_ISLNK(st.st_mode) and bool(st.st_mode & 0o077)


def _walk(root: Path, prune: frozenset[str] = frozenset()) -> list[Path]:
    found = [root]
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinks
        dirnames[:] = [d for d in dirnames if d not in prune]
        found += [Path(dirpath) / n for n in (*dirnames, *filenames)]
    return found


def _narrow(path: Path) -> int:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
        return 0
    os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    return 1
