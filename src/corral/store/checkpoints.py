"""Signed checkpoints of the audit chains' heads, kept outside the database
(docs/explanation/audit.md).

What a database writer can do unseen by the chain alone: remove the newest records and rewind
the head to the last one kept. A checkpoint is the head as it was (chain, seq, hash, keyed_from,
time), signed with HMAC-SHA256 under the audit key and appended as one JSON line to
`<data dir>/audit-checkpoints.jsonl` (0600, opened O_APPEND, never rewritten). `corral audit
verify` then checks that each chain still passes through every checkpoint and reaches the last
(store/chain.py `ChainCheck`). A line whose signature does not match (edited, or forged without
the key) is reported and not trusted.

The engine writes one (runtime/audit.py) for every chain that moved, after
`audit.checkpoint_every_records` records or `audit.checkpoint_every_s` seconds, and when it stops
cleanly. Engines sharing a PostgreSQL store each keep their own file beside their data.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from corral.store.chain import Head, Mark, Problem

FILE = "checkpoints"  # what problems with the file itself are reported under


def _signed(fields: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":")).encode()


def sign(key: bytes, fields: Mapping[str, Any]) -> str:
    return hmac.new(key, _signed(fields), hashlib.sha256).hexdigest()


def line(key: bytes, chain: str, head: Head, at: float) -> str:
    """One checkpoint as the JSON line the file holds."""
    fields = {
        "chain": chain,
        "seq": head.seq,
        "hash": head.hash,
        "keyed_from": head.keyed_from,
        "at": round(at, 3),
    }
    return json.dumps({**fields, "mac": sign(key, fields)}, sort_keys=True) + "\n"


def append(path: Path, key: bytes, heads: Mapping[str, Head], at: float) -> int:
    """Append a checkpoint of each head (one write, O_APPEND: lines never interleave or get
    overwritten); the number written."""
    text = "".join(line(key, chain, head, at) for chain, head in sorted(heads.items()))
    if not text:
        return 0
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(heads)


def parse(lines: Iterable[str], key: bytes | None) -> tuple[list[Mark], list[Problem]]:
    """The checkpoints whose signature holds, and a problem for every line that does not (or
    for the whole file when there is no key to check it with)."""
    marks: list[Mark] = []
    problems: list[Problem] = []
    count = 0
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        count += 1
        if key is None:
            continue
        try:
            data = json.loads(text)
            mac = data.pop("mac")
            fields = {k: data[k] for k in ("chain", "seq", "hash", "keyed_from", "at")}
            valid = isinstance(mac, str) and hmac.compare_digest(sign(key, fields), mac)
            mark = Mark(
                chain=str(fields["chain"]),
                seq=int(fields["seq"]),
                hash=str(fields["hash"]),
                at=float(fields["at"]),
                keyed_from=None if fields["keyed_from"] is None else int(fields["keyed_from"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append((FILE, f"line {n}", "not a checkpoint (the line was changed)"))
            continue
        if not valid:
            problems.append(
                (
                    FILE,
                    f"line {n}",
                    "its signature does not match (the line was"
                    " changed, or written without the key)",
                )
            )
            continue
        marks.append(mark)
    if key is None and count:
        problems.append(
            (
                FILE,
                "-",
                f"{count} checkpoints cannot be checked: no audit key (audit.key is missing)",
            )
        )
    return marks, problems


def read(path: Path, key: bytes | None) -> tuple[list[Mark], list[Problem]]:
    """The file's checkpoints (none when it does not exist yet), read a line at a time."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return parse(f, key)
    except FileNotFoundError:
        return [], []


def latest(marks: Iterable[Mark]) -> dict[str, Mark]:
    """Each chain's newest checkpoint (the highest seq)."""
    out: dict[str, Mark] = {}
    for m in marks:
        if m.chain not in out or m.seq >= out[m.chain].seq:
            out[m.chain] = m
    return out
