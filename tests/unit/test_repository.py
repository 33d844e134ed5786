"""The repository is what a reader has: its docs, comments and tests cite only files inside it.

Design notes and tracker issues live outside the repository; a pointer to them (a section sign
into a document the reader does not have, an issue number) leaves the reader with nothing. What a
reader needs goes into docs/ and is cited from there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests", "bench", "docs", "scripts", "examples")
TOP_LEVEL = ("README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".sql", ".yaml", ".yml", ".toml", ".c", ".sh", ".json", ".txt", ""}

# Pointers to documents outside the repository.
OUTSIDE = re.compile(
    r"§\s*\d"  # a section of some document
    r"|\bseed[- ]semantics\b|\bseeds? \d{3}\b"  # the design seeds
    r"|\bagent-clis\.md\b|\bplatform\.md\b|\bDESIGN\.md\b|\bSTYLE\.md\b|\bpeer-bench\b"
    r"|\bissue \d+\b|\bshared/(?:reference|seeds)\b"
)


def _files() -> list[Path]:
    found = [ROOT / name for name in TOP_LEVEL]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if (
                path.is_file()
                and path.suffix in SUFFIXES
                and "__pycache__" not in path.parts
                and "node_modules" not in path.parts
                and path != Path(__file__).resolve()
            ):
                found.append(path)
    return [p for p in found if p.exists()]


def test_nothing_cites_a_document_outside_the_repository() -> None:
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "cites a document outside the repository:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "line",
    [
        "the stream format (agent-clis.md §2.3)",
        "seed-semantics says so",
        "see issue 12",
        "per seed 001",
        "../shared/reference/platform.md",
    ],
)
def test_the_scan_recognises_an_outside_citation(line: str) -> None:
    assert OUTSIDE.search(line)


def test_the_scan_lets_ordinary_words_through() -> None:
    for line in ("random.seed(7)", "an issue with the lock", "docs/reference/cli.md"):
        assert not OUTSIDE.search(line)
