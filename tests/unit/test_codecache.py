"""The table of dataclass code (codecache.py): a dataclass made from it is the one `exec` makes;
a second process compiles nothing the first did; a table that cannot be trusted or read is
ignored. Each case runs in a fresh interpreter: the table serves `dataclasses` process-wide."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path
from types import CodeType

import pytest

from corral import codecache

# Makes a frozen, slotted dataclass with a default and a factory, and says what it is: its
# methods' behaviour and annotations, and how many texts were compiled (added to the table).
PROBE = """\
import dataclasses, json, sys, typing
from pathlib import Path
from corral import codecache
codecache.PATH = Path(sys.argv[1])
if sys.argv[2] == "cached":
    codecache.install()
known = len(codecache._codes)  # from the table: what is compiled now is added

@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    x: int
    y: float = 0.5
    tags: tuple[str, ...] = ()
    more: list[int] = dataclasses.field(default_factory=list, hash=False)

p = Point(x=1, tags=("a",))
try:
    p.x = 2
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
print(json.dumps({
    "repr": repr(p),
    "eq": p == Point(x=1, tags=("a",)) and p != Point(x=2),
    "hash": hash(p) == hash(Point(x=1, tags=("a",))),
    "frozen": frozen,
    "factory": Point(x=1).more == [] and Point(x=1).more is not Point(x=2).more,
    "init": {k: repr(v) for k, v in Point.__init__.__annotations__.items()},
    "hints": {k: repr(v) for k, v in typing.get_type_hints(Point.__init__).items()},
    "slots": Point.__slots__,
    "compiled": len(codecache._codes) - known,
}))
"""


def probe(table: Path, mode: str = "cached") -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(table), mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    said: dict[str, object] = json.loads(r.stdout)
    return said


def test_a_dataclass_from_the_table_is_the_one_exec_makes(tmp_path: Path) -> None:
    table = tmp_path / "dataclasses.bin"
    plain = probe(table, "plain")
    assert not table.exists() and plain["frozen"] and plain["eq"] and plain["factory"]
    first = probe(table)  # compiles, and writes the table at exit
    assert table.is_file() and first["compiled"] == 6  # init repr eq hash setattr delattr
    second = probe(table)
    assert second["compiled"] == 0  # all from the table
    for said in (first, second):
        assert {**said, "compiled": 0} == {**plain, "compiled": 0}
    assert plain["init"] == {"x": "<class 'int'>", "y": "<class 'float'>",
                             "tags": "tuple[str, ...]", "more": "list[int]",
                             "return": "None"}  # fmt: skip


def _table_made(tmp_path: Path) -> Path:
    table = tmp_path / "dataclasses.bin"
    probe(table)
    assert probe(table)["compiled"] == 0
    return table


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other python", "not a table"])
def test_a_damaged_table_is_ignored_and_replaced(tmp_path: Path, damage: str) -> None:
    table = _table_made(tmp_path)
    data = table.read_bytes()
    table.write_bytes(
        {
            "garbage": b"\x00not marshal at all",
            "truncated": data[: len(data) // 2],
            "other python": marshal.dumps((("cpython-00", "0.0"), marshal.loads(data)[1])),
            "not a table": marshal.dumps((codecache._TAG, ["code"])),
        }[damage]
    )
    assert probe(table)["compiled"] == 6
    assert probe(table)["compiled"] == 0  # written anew


def test_a_table_others_could_write_is_not_read(tmp_path: Path) -> None:
    table = _table_made(tmp_path)
    os.chmod(table, 0o664)
    assert probe(table)["compiled"] == 6
    assert probe(table)["compiled"] == 0  # written anew, this user's alone


def test_a_table_reached_through_a_symlink_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "dataclasses.bin"
    link.symlink_to(_table_made(tmp_path / "real"))
    assert probe(link)["compiled"] == 6


def test_an_entry_that_does_not_unmarshal_is_compiled_again(tmp_path: Path) -> None:
    table = _table_made(tmp_path)
    entries = codecache._read(table)
    assert entries
    codecache._write(table, {key: b"\x00" for key in entries})
    assert probe(table)["eq"]  # compiled again, the same keys: and written back whole
    assert all(isinstance(marshal.loads(v), CodeType) for v in codecache._read(table).values())


def test_the_corral_command_runs_from_the_packages_table(tmp_path: Path) -> None:
    """`corral` installs it before the CLI's modules load, and the package's own table,
    filled by one run, serves the next."""
    corral = str(Path(sys.executable).with_name("corral"))
    env = {**os.environ, "CORRAL_DATA_DIR": str(tmp_path / "data")}
    r = subprocess.run(
        [corral, "jobs", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    code = (
        "from corral import codecache, main; "
        "print(codecache.dataclasses.exec is codecache._exec, len(codecache._codes))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    installed, entries = r.stdout.split()
    assert installed == "True" and int(entries) > 100, r.stderr


def test_a_table_grown_past_its_bound_starts_again_from_what_was_used(tmp_path: Path) -> None:
    table = _table_made(tmp_path)
    mine = codecache._read(table)
    spoiled = next(iter(mine))  # one of the probe's texts, unreadable: compiled and written
    old = {os.urandom(20): b"\x00" for _ in range(codecache.MAX_ENTRIES)}  # older code's texts
    codecache._write(table, {**old, **mine, spoiled: b"\x00"})
    probe(table)
    kept = codecache._read(table)
    assert len(kept) == 6 and spoiled in kept  # the probe's class alone
