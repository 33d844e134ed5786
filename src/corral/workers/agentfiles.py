"""Reading a file an agent wrote (a decomposer's proposal, a judge's verdict, an extractor's
learnings): the agent chose what sits at that name, so it is opened as a regular file of its
folder and nothing else. A symbolic link is refused, not followed (it could name any file the
engine can read); a FIFO, socket or device is refused before a read that would wait on it
forever; and no more is read than the caller can tell is too much."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class TooLarge(ValueError):
    """The file holds more than its reader takes."""


def read_agent_file(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the file (more than `limit`: the caller refuses it as too
    large); OSError when it is missing, a link or not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def read_agent_json(path: Path, limit: int) -> Any:
    """The file as JSON: TooLarge over `limit` bytes, ValueError when it is not JSON; OSError
    as `read_agent_file`."""
    data = read_agent_file(path, limit)
    if len(data) > limit:
        raise TooLarge(f"{path.name} is over {limit // 1024} KiB")
    return json.loads(data)
