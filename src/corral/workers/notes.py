"""`worker-note.json`: what a worker's own helper process (the Ray job watcher, the notebook
runner) tells the engine about an attempt's end that an exit code cannot: the error in words
and whose fault it was. Read with the attempt's result (workers/command.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

NOTE_FILE = "worker-note.json"
MAX_NOTE_BYTES = 16 * 1024
FAULTS = ("worker", "job", "config")


def write_note(attempt_dir: Path, *, error: str, fault: str, **data: Any) -> None:
    """Written whole (a temporary file renamed over it)."""
    body = json.dumps({"error": error[:4000], "fault": fault, **data})
    tmp = attempt_dir / f".{NOTE_FILE}.{os.getpid()}"
    tmp.write_text(body)
    tmp.replace(attempt_dir / NOTE_FILE)


def read_note(attempt_dir: Path) -> tuple[str, str] | None:
    """(error, fault) the attempt's helper left, or None."""
    try:
        with (attempt_dir / NOTE_FILE).open("rb") as f:
            raw = f.read(MAX_NOTE_BYTES + 1)
        doc = json.loads(raw) if len(raw) <= MAX_NOTE_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    error, fault = doc.get("error"), doc.get("fault")
    if not isinstance(error, str) or not error or fault not in FAULTS:
        return None
    return error, fault
