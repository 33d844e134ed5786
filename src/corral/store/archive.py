"""Retention's archive files (docs/how-to/retention.md): JSON Lines, one file per batch, written
whole before the batch's rows are deleted.

The first line is the header: `{"archive": 1, "at", "jobs", "segments": {chain: [from seq, from
hash, to seq, to hash]}}`; every other line is one row as the store held it, `{"table", "row"}`.
A file is written to a temporary name in the same directory, synced, renamed into place and the
directory synced: a crash leaves either no file or the whole file, never half of one. A file
whose delete then did not commit holds rows that are still in the store; the store's `archives`
table names the files that count.

Verification (`verify_file`) walks each chain segment of a file from its first head to its last
with the same check as the live chain (store/chain.py), so the archived part of a chain is
verified exactly as the rest; the live chain starts where the last archive ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.core.ports import ChainHead, GcBatch
from corral.store.chain import CHAINS, Problem, verify_rows
from corral.store.retention import segments_json

VERSION = 1


def _line(value: Mapping[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str) + "\n"


def write(folder: Path, name: str, batch: GcBatch, at: float) -> Path:
    """Write the batch's archive atomically as `folder/name`; its path."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / name
    tmp = folder / f".{name}.tmp"
    header = {
        "archive": VERSION,
        "at": at,
        "jobs": len(batch.jobs),
        "segments": json.loads(segments_json(batch.segments)),
    }
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_line(header))
            for table, rows in batch.rows.items():
                for row in rows:
                    out.write(_line({"table": table, "row": row}))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dirfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    return path


def read(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """(header, table → rows) of an archive file; ValueError when it is not one."""
    rows: dict[str, list[dict[str, Any]]] = {}
    with path.open(encoding="utf-8") as f:
        header = json.loads(f.readline() or "null")
        if not isinstance(header, dict) or header.get("archive") != VERSION:
            raise ValueError(f"{path} is not a corral archive (version {VERSION})")
        for text in f:
            entry = json.loads(text)
            rows.setdefault(str(entry["table"]), []).append(entry["row"])
    return header, rows


def verify_file(
    path: Path, segments: Mapping[str, tuple[ChainHead, ChainHead]], key: bytes | None
) -> tuple[int, list[Problem]]:
    """Check each chain segment the store recorded for this file against the file's rows: they
    link from the segment's first head to its last, every hash intact. (records checked,
    problems)."""
    where = f"archive {path.name}"
    try:
        header, rows = read(path)
    except (OSError, ValueError) as err:
        return 0, [(where, "", f"cannot read the archive: {err}")]
    checked, problems = 0, list[Problem]()
    recorded = json.loads(segments_json(segments))
    if header.get("segments") != recorded:
        problems.append((where, "", "its header does not match the segments the store recorded"))
    for table, (start, end) in segments.items():
        if table not in CHAINS:
            continue
        check = verify_rows(table, rows.get(table, []), end, key, start=start)
        checked += check.checked
        problems += [(f"{where} {t}", row, why) for t, row, why in check.problems]
    return checked, problems
