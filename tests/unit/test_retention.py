"""Retention's runs (runtime/retention.py) over the memory store: the archive file is whole on
disk before the delete, a dry run changes nothing, one collector at a time, attempt directories
are removed only inside the data directory's attempts/, and leftovers of jobs the store no
longer has are swept only once older than the shortest retention."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.config import Config, load
from corral.core.ports import GcBatch
from corral.domain.errors import Conflict, NotFound, StoreError
from corral.domain.states import JobState
from corral.runtime import retention
from corral.store import archive
from corral.store.memory import MemoryStore
from tests.contract.test_governance_contract import report_for
from tests.contract.test_retention_contract import LATER, done
from tests.contract.test_store_contract import end, submit

DAY = 86400.0


def _config(tmp_path: Path, text: str = "retention: {keep_jobs: 0}\n") -> Config:
    path = tmp_path / "corral.yaml"
    path.write_text(text)
    return load(data_dir=tmp_path / "data", config_path=path)


def test_a_run_writes_the_whole_archive_before_it_deletes(tmp_path: Path) -> None:
    cfg = _config(tmp_path)

    async def main() -> None:
        store = MemoryStore()
        jobs = [await done(store) for _ in range(3)]
        seen: list[tuple[Path, int]] = []
        remove = store.gc_remove

        async def checked(batch: GcBatch, **kw: Any) -> int:
            path = retention.archive_dir(cfg) / kw["archive"]
            header, rows = archive.read(path)  # on disk, whole, before anything goes
            assert header["jobs"] == len(batch.jobs)
            assert sorted(r["id"] for r in rows["jobs"]) == sorted(batch.jobs)
            assert await store.gc_known(batch.jobs) == set(batch.jobs)  # not deleted yet
            seen.append((path, len(rows["job_events"])))
            return await remove(batch, **kw)

        store.gc_remove = checked  # type: ignore[method-assign]
        progress: list[retention.GcProgress] = []
        result = await retention.collect(
            store, cfg, holder="t", now=LATER, progress=progress.append
        )
        assert result.jobs == 3 and result.batches == 1 and len(seen) == 1
        assert [p.jobs for p in progress] == [3]
        for job in jobs:
            with pytest.raises(NotFound):
                await store.get_job(job.id)
        path, records = seen[0]
        assert result.archives == (str(path),) and result.records["job_events"] == records
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert not list(path.parent.glob(".*.tmp"))
        [record] = await store.archives()
        count, problems = archive.verify_file(path, record.segments, None)
        assert count == sum(result.records.values())  # every chain's segment, the reports too
        assert result.records["run_reports"] == 3
        assert all("keyed" in why for _, _, why in problems)  # no key given: said, not hidden

    anyio.run(main)


def test_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    cfg = _config(tmp_path)

    async def main() -> None:
        store = MemoryStore()
        jobs = [await done(store) for _ in range(2)]
        result = await retention.collect(store, cfg, holder="t", dry_run=True, now=LATER)
        assert result.dry_run and sorted(result.job_ids) == sorted(j.id for j in jobs)
        assert result.archives == () and result.batches == 0
        for job in jobs:
            assert await store.get_job(job.id)
        assert await store.archives() == []
        assert not retention.archive_dir(cfg).exists()

    anyio.run(main)


def test_one_collector_at_a_time_and_the_engine_rides_failures_out(tmp_path: Path) -> None:
    cfg = _config(tmp_path)

    async def main() -> None:
        store = MemoryStore()
        await done(store)
        assert await store.claim_gc("engine-a", now=time.time(), lease_s=60)
        with pytest.raises(Conflict, match="collecting"):
            await retention.collect(store, cfg, holder="gc-cli", now=LATER)
        retainer = retention.Retainer(store, cfg, holder="engine-b")
        assert await retainer.once() is None  # another holds the lease: skipped quietly
        await store.release_gc("engine-a")

        async def broken(*_: Any, **__: Any) -> list[str]:
            raise StoreError("database is locked")

        store.gc_candidates = broken  # type: ignore[method-assign]
        assert await retainer.once() is None  # logged, tried at the next interval
        assert await store.claim_gc("other", now=time.time(), lease_s=60)  # lease released

    anyio.run(main)


def test_directories_are_removed_only_inside_the_attempts_root(tmp_path: Path) -> None:
    root = tmp_path / "attempts"
    inside = root / "J1.1"
    inside.mkdir(parents=True)
    (inside / "stdout").write_text("x")
    outside = tmp_path / "elsewhere" / "J2.1"
    outside.mkdir(parents=True)
    sneaky = root / ".." / "elsewhere"
    removed = retention._remove_dirs(root, [str(inside), str(outside), str(sneaky), str(root)])
    assert removed == 1
    assert not inside.exists() and outside.exists() and root.exists()


def test_leftover_directories_are_swept_only_once_older_than_the_shortest_retention(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, "retention:\n  keep_days: 10\n  roles:\n    fast: {keep_days: 2}\n")
    root = cfg.data_dir / "attempts"

    async def main() -> None:
        store = MemoryStore()
        kept = await done(store)
        now = time.time()
        made = {}
        for name, age in (
            (f"{kept.id}.1", 5 * DAY),  # its job is in the store: stays
            ("GONE1.1", 5 * DAY),  # no such job, older than 2 days: swept
            ("GONE1.2", 5 * DAY),
            ("GONE2.1", 1 * DAY),  # no such job, but younger than 2 days: stays
            ("notanattempt", 5 * DAY),  # not `<job>.<n>`: never touched
        ):
            d = root / name
            d.mkdir(parents=True)
            os.utime(d, (now - age, now - age))
            made[name] = d
        assert await retention.sweep(store, cfg, now=now) == 2
        assert sorted(p.name for p in root.iterdir()) == sorted(
            [f"{kept.id}.1", "GONE2.1", "notanattempt"]
        )

    anyio.run(main)


def test_a_batch_whose_jobs_interleave_with_the_next_candidates_looks_at_more(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, "retention: {keep_jobs: 0, batch: 1}\n")

    async def main() -> None:
        store = MemoryStore()
        first = await submit(store)
        second = await submit(store)  # submitted before the first ended: records interleave
        for job in (first, second):
            ended = await end(store, job, JobState.SUCCEEDED)
            await store.record_report(report_for(ended))
        alone = await store.gc_collect([first.id], sinks=())
        assert alone.jobs == () and alone.held == 1
        result = await retention.collect(store, cfg, holder="t", now=LATER)
        assert result.jobs == 2 and result.held == 0 and result.batches == 1

    anyio.run(main)
