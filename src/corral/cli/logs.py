"""`corral logs`: copy attempt log files to our stdout/stderr, optionally following them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

import anyio

from corral.core.ports import JobStore
from corral.domain.models import Attempt

CHUNK = 1 << 16


def _copy(path: Path, offset: int, out: BinaryIO) -> int:
    """Copy new bytes from `offset`; the new offset. Bounded memory whatever the file size."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK):
                out.write(chunk)
                offset += len(chunk)
    except FileNotFoundError:
        return offset
    out.flush()
    return offset


def _drain(attempts: list[Attempt], offsets: dict[tuple[int, str], int]) -> None:
    for a in attempts:
        for name, out in (("stdout.log", sys.stdout.buffer), ("stderr.log", sys.stderr.buffer)):
            key = (a.index, name)
            offsets[key] = _copy(Path(a.dir) / name, offsets.get(key, 0), out)


async def stream_logs(store: JobStore, ref: str, *, follow: bool, only: int | None) -> None:
    job = await store.get_job(ref)
    offsets: dict[tuple[int, str], int] = {}
    while True:
        attempts = [a for a in await store.attempts(job.id) if only in (None, a.index)]
        _drain(attempts, offsets)
        if not follow:
            return
        job = await store.get_job(job.id)
        if job.state.terminal and all(a.state.terminal for a in attempts):
            _drain(attempts, offsets)  # the last bytes may have landed after our read
            return
        await anyio.sleep(0.2)
