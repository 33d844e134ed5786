"""A reader of W&B's offline run file (`offline-run-*/run-<id>.wandb`), standard library only.

wandb has no Python reader for it, and `wandb sync` cannot show it. The layout, as the pinned
wandb (0.31.0, pyproject's `training` extra) writes it:

- a 7-byte header: `:W&B`, the magic 0xBEE1 (little endian), version 0;
- records in the LevelDB log layout: 32 KiB blocks; each record chunk is a 7-byte header (crc32
  of the type byte and the data, u32 LE; length u16 LE; type u8: 1 full, 2 first, 3 middle,
  4 last) and its data; a block's tail shorter than a header is zero padding;
- each record's data is a protobuf `wandb_internal_pb2.Record`. Only the fields read here are
  decoded (their numbers from the pinned wandb's descriptors): `history` (2), `summary` (3),
  `config` (5), `run` (17), `exit` (18).

It is an internal format: a file that does not follow it raises `RunFileError`, never a
traceback of the decoder. The reader is tested against files the pinned wandb wrote
(tests/unit/test_wandbfile.py).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b":W&B"
HEADER = 7
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_FILE_BYTES = 256 << 20
MAX_HISTORY = 100_000

# wandb_internal_pb2 field numbers (wandb 0.31.0)
REC_HISTORY, REC_SUMMARY, REC_CONFIG, REC_RUN, REC_EXIT = 2, 3, 5, 17, 18
ITEM_KEY, ITEM_NESTED, ITEM_VALUE_JSON = 1, 2, 16
HIST_ITEM, HIST_STEP = 1, 2
HITEM_BOOL, HITEM_INT, HITEM_NUMBER, HITEM_TEXT, HITEM_JSON = 4, 5, 6, 7, 8
UPDATE, REMOVE = 1, 2
RUN_ID, RUN_ENTITY, RUN_PROJECT, RUN_CONFIG, RUN_SUMMARY = 1, 2, 3, 4, 5
RUN_DISPLAY_NAME, RUN_TAGS = 8, 10
EXIT_CODE = 1


class RunFileError(ValueError):
    """The file is not a W&B run file this reader understands."""


@dataclass(slots=True)
class Run:
    """What one offline run recorded: its id, project and tags, its config and summary, its
    history (one dict per logged step) and its exit code (None: it did not finish)."""

    run_id: str = ""
    project: str = ""
    entity: str = ""
    display_name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None

    def series(self, key: str) -> list[tuple[float, float]]:
        """(step, value) of one numeric metric, in the order it was logged."""
        out = []
        for i, row in enumerate(self.history):
            value = row.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                step = row.get("_step", i)
                out.append((float(step if isinstance(step, int | float) else i), float(value)))
        return out


def records(data: bytes) -> Iterator[bytes]:
    """The records of a run file's bytes, each checked against its crc."""
    if len(data) < HEADER or data[:4] != MAGIC:
        raise RunFileError("not a W&B run file (no :W&B header)")
    magic, version = struct.unpack_from("<HB", data, 4)
    if magic != 0xBEE1 or version != 0:
        raise RunFileError(f"unknown W&B run file version (magic {magic:#x}, version {version})")
    pos, parts = HEADER, bytearray()
    pending = False
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if crc == 0 and length == 0 and kind == 0:  # padding to the block's end
            pos += left
            continue
        start, end = pos + HEADER, pos + HEADER + length
        if end > len(data):
            break  # a record still being written: the run is going on
        chunk = data[start:end]
        if zlib.crc32(bytes([kind]) + chunk) != crc:
            raise RunFileError(f"record at byte {pos} fails its checksum")
        pos = end
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            parts, pending = bytearray(chunk), True
        elif kind in (MIDDLE, LAST) and pending:
            parts += chunk
            if kind == LAST:
                pending = False
                yield bytes(parts)
        else:
            raise RunFileError(f"record at byte {pos} has an unknown type {kind}")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise RunFileError("truncated protobuf varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes) -> dict[int, list[Any]]:
    """A protobuf message's fields by number: ints for varints, bytes for length-delimited,
    floats for fixed64 (a double) and fixed32."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise RunFileError("truncated protobuf fixed64")
            value = struct.unpack_from("<d", buf, pos)[0]
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise RunFileError("truncated protobuf field")
            value = buf[pos : pos + length]
            pos += length
        elif wire == 5:
            if pos + 4 > len(buf):
                raise RunFileError("truncated protobuf fixed32")
            value = struct.unpack_from("<f", buf, pos)[0]
            pos += 4
        else:
            raise RunFileError(f"unsupported protobuf wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _text(f: dict[int, list[Any]], number: int) -> str:
    values = f.get(number)
    return values[-1].decode("utf-8", "replace") if values else ""


def _json(raw: str) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else str(value)


def _item(buf: bytes) -> tuple[list[str], Any]:
    """A config, summary or history item: its key path and its value."""
    f = fields(buf)
    nested = [v.decode("utf-8", "replace") for v in f.get(ITEM_NESTED, [])]
    path = nested or [_text(f, ITEM_KEY)]
    if ITEM_VALUE_JSON in f:
        return path, _json(_text(f, ITEM_VALUE_JSON))
    if HITEM_NUMBER in f:
        return path, _finite(f[HITEM_NUMBER][-1])
    if HITEM_INT in f:
        raw = f[HITEM_INT][-1]
        return path, (raw >> 1) ^ -(raw & 1)  # sint64: zigzag
    if HITEM_BOOL in f:
        return path, bool(f[HITEM_BOOL][-1])
    if HITEM_TEXT in f:
        return path, _text(f, HITEM_TEXT)
    if HITEM_JSON in f:
        return path, _json(_text(f, HITEM_JSON))
    return path, None


def _put(target: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        nxt = target.get(key)
        if not isinstance(nxt, dict):
            nxt = target[key] = {}
        target = nxt
    target[path[-1]] = value


def _drop(target: dict[str, Any], path: list[str]) -> None:
    for key in path[:-1]:
        nxt = target.get(key)
        if not isinstance(nxt, dict):
            return
        target = nxt
    target.pop(path[-1], None)


def _apply(target: dict[str, Any], buf: bytes) -> None:
    """A config or summary record (updates, then removals) onto `target`."""
    f = fields(buf)
    for raw in f.get(UPDATE, []):
        path, value = _item(raw)
        _put(target, path, value)
    for raw in f.get(REMOVE, []):
        path, _ = _item(raw)
        _drop(target, path)


def parse(data: bytes) -> Run:
    """The run in a run file's bytes."""
    run = Run()
    for raw in records(data):
        rec = fields(raw)
        if REC_HISTORY in rec and len(run.history) < MAX_HISTORY:
            h = fields(rec[REC_HISTORY][-1])
            row: dict[str, Any] = {}
            for item in h.get(HIST_ITEM, []):
                path, value = _item(item)
                _put(row, path, value)
            if HIST_STEP in h and "_step" not in row:
                row["_step"] = fields(h[HIST_STEP][-1]).get(1, [0])[-1]
            run.history.append(row)
        elif REC_SUMMARY in rec:
            _apply(run.summary, rec[REC_SUMMARY][-1])
        elif REC_CONFIG in rec:
            _apply(run.config, rec[REC_CONFIG][-1])
        elif REC_RUN in rec:
            _run(run, fields(rec[REC_RUN][-1]))
        elif REC_EXIT in rec:
            code = fields(rec[REC_EXIT][-1]).get(EXIT_CODE, [0])[-1]
            run.exit_code = code - (1 << 32) if code >= 1 << 31 else code
    return run


def _run(run: Run, f: dict[int, list[Any]]) -> None:
    run.run_id = _text(f, RUN_ID) or run.run_id
    run.project = _text(f, RUN_PROJECT) or run.project
    run.entity = _text(f, RUN_ENTITY) or run.entity
    run.display_name = _text(f, RUN_DISPLAY_NAME) or run.display_name
    run.tags = [t.decode("utf-8", "replace") for t in f.get(RUN_TAGS, [])] or run.tags
    if RUN_CONFIG in f:
        _apply(run.config, f[RUN_CONFIG][-1])
    if RUN_SUMMARY in f:
        _apply(run.summary, f[RUN_SUMMARY][-1])


def read(path: Path) -> Run:
    """The run in an offline run file; RunFileError when it cannot be read."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RunFileError(f"{path} is over {MAX_FILE_BYTES >> 20} MiB")
        data = path.read_bytes()
    except OSError as err:
        raise RunFileError(f"cannot read {path}: {err.strerror or err}") from None
    return parse(data)
