"""The signed checkpoint file (store/checkpoints.py) and the engine's checkpointer
(runtime/audit.py): private, append-only, every edited or forged line found."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

from corral.config import Config, load
from corral.core.ports import ChainHead
from corral.domain.models import JobEvent
from corral.store import checkpoints
from corral.store.memory import MemoryStore
from corral.workers.sealing import KeyFile

KEY = b"\x07" * 32
HEADS = {
    "policy_evaluations": ChainHead(12, "k1:" + "a" * 64, 1),
    "job_events": ChainHead(3, "k1:" + "b" * 64, 1),
}


def test_checkpoints_round_trip_in_a_private_append_only_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "audit-checkpoints.jsonl"
    old = os.umask(0)
    try:
        assert checkpoints.append(path, KEY, HEADS, 1000.0) == 2
        assert checkpoints.append(path, KEY, {"job_events": ChainHead(4, "k1:c", 1)}, 1001.0) == 1
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    marks, problems = checkpoints.read(path, KEY)
    assert problems == []
    assert [(m.chain, m.seq, m.at) for m in marks] == [
        ("job_events", 3, 1000.0),
        ("policy_evaluations", 12, 1000.0),
        ("job_events", 4, 1001.0),
    ]
    assert checkpoints.latest(marks)["job_events"].seq == 4


def test_an_edited_or_forged_line_is_reported_and_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "audit-checkpoints.jsonl"
    checkpoints.append(path, KEY, HEADS, 1000.0)
    lines = path.read_text().splitlines()
    edited = json.loads(lines[1])
    edited["seq"] = 9  # an attacker lowers the checkpointed head to match a truncated chain
    forged = checkpoints.line(b"\x02" * 32, "job_events", ChainHead(1, "x"), 1002.0)
    path.write_text("\n".join([lines[0], json.dumps(edited), "{not json", forged]) + "\n")
    marks, problems = checkpoints.read(path, KEY)
    assert [m.chain for m in marks] == ["job_events"]
    assert [(where, why.split(" (")[0]) for _, where, why in problems] == [
        ("line 2", "its signature does not match"),
        ("line 3", "not a checkpoint"),
        ("line 4", "its signature does not match"),
    ]


def test_without_the_key_checkpoints_are_reported_unchecked(tmp_path: Path) -> None:
    path = tmp_path / "audit-checkpoints.jsonl"
    assert checkpoints.read(path, None) == ([], [])  # no file yet: nothing to check
    checkpoints.append(path, KEY, HEADS, 1000.0)
    marks, problems = checkpoints.read(path, None)
    assert marks == []
    assert problems == [
        ("checkpoints", "-", "2 checkpoints cannot be checked: no audit key (audit.key is missing)")
    ]


def _config(tmp_path: Path, every_records: int, every_s: float) -> Config:
    (tmp_path / "corral.yaml").write_text(
        f"audit:\n  checkpoint_every_records: {every_records}\n  checkpoint_every_s: {every_s}\n"
    )
    return load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")


def test_the_checkpointer_writes_after_n_records_or_t_seconds_and_at_a_stop(tmp_path: Path) -> None:
    from corral.runtime.audit import Checkpointer

    config = _config(tmp_path, every_records=3, every_s=60)
    now = [1000.0]
    store = MemoryStore()
    store.use_audit_key(KeyFile(config.audit_key))
    cp = Checkpointer(store, config, clock=lambda: now[0])

    async def events(n: int) -> None:
        await store.append_events(
            [JobEvent(job_id="j", at=now[0], kind="k", message="m") for _ in range(n)]
        )

    async def main() -> list[int]:
        assert await cp.start() == []
        written = [await cp.tick()]  # nothing moved
        await events(2)
        written.append(await cp.tick())  # 2 < 3 records, 0 s < 60 s
        await events(1)
        written.append(await cp.tick())  # 3 records: due
        await events(1)
        now[0] += 61
        written.append(await cp.tick())  # 1 record but 61 s: due
        await events(1)
        await cp.flush()  # the clean stop writes what moved
        written.append(await cp.tick(force=True))  # nothing moved since
        return written

    assert asyncio.run(main()) == [0, 0, 1, 1, 0]
    marks, problems = checkpoints.read(
        config.audit_checkpoints, KeyFile(config.audit_key).get(create=False)
    )
    assert problems == [] and [m.seq for m in marks] == [3, 4, 5]
    assert stat.S_IMODE(config.audit_key.stat().st_mode) == 0o600


def test_the_checkpointer_warns_when_a_head_is_behind_its_checkpoint(tmp_path: Path) -> None:
    from corral.runtime.audit import Checkpointer

    config = _config(tmp_path, every_records=1, every_s=60)
    key = KeyFile(config.audit_key)
    checkpoints.append(
        config.audit_checkpoints,
        key.load(create=True),
        {"job_events": ChainHead(7, "k1:x", 1)},
        1000.0,
    )
    store = MemoryStore()
    store.use_audit_key(key)
    [warning] = asyncio.run(Checkpointer(store, config).start())
    assert warning.startswith("audit chain job_events: the head is seq 0 but the checkpoint")
    assert "says seq 7: records were removed" in warning
