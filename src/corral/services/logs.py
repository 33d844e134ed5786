"""A job's output, attempt by attempt: a byte range of one attempt's stdout or stderr file, for
the edges that page through it (the HTTP API) rather than copy it (cli/logs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corral.core.ports import JobStore
from corral.domain.errors import InvalidRequest, NotFound
from corral.domain.models import Job

Stream = Literal["stdout", "stderr"]
MAX_CHUNK = 1 << 20  # bytes one read returns at most


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Bytes `offset`…`next_offset` of an attempt's stream, and whether the file is complete
    (the attempt ended and nothing is left after `next_offset`)."""

    attempt: int | None  # None: the job has no attempt yet
    offset: int
    next_offset: int
    data: bytes
    complete: bool


async def log_chunk(
    store: JobStore,
    job: Job,
    *,
    stream: Stream = "stdout",
    attempt: int | None = None,
    offset: int = 0,
    limit: int = MAX_CHUNK,
) -> LogChunk:
    """Up to `limit` bytes of `attempt`'s (default: the latest attempt's) `stream` from
    `offset`."""
    if offset < 0 or not 1 <= limit <= MAX_CHUNK:
        raise InvalidRequest(f"offset must be ≥ 0 and limit 1 … {MAX_CHUNK}")
    attempts = await store.attempts(job.id)
    if attempt is not None:
        attempts = [a for a in attempts if a.index == attempt]
        if not attempts:
            raise NotFound(f"job {job.id} has no attempt {attempt}")
    if not attempts:
        return LogChunk(None, offset, offset, b"", job.state.terminal)
    a = attempts[-1]
    data = _read(Path(a.dir) / f"{stream}.log", offset, limit)
    size = _size(Path(a.dir) / f"{stream}.log")
    end = offset + len(data)
    return LogChunk(a.index, offset, end, data, a.state.terminal and end >= size)


def _read(path: Path, offset: int, limit: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def tail(
    store: JobStore, job: Job, *, stream: Stream = "stdout", limit: int = 65536
) -> LogChunk:
    """The last `limit` bytes of the latest attempt's `stream` (all of it when shorter)."""
    attempts = await store.attempts(job.id)
    if not attempts:
        return LogChunk(None, 0, 0, b"", job.state.terminal)
    size = _size(Path(attempts[-1].dir) / f"{stream}.log")
    return await log_chunk(
        store,
        job,
        stream=stream,
        attempt=attempts[-1].index,
        offset=max(0, size - limit),
        limit=limit,
    )
