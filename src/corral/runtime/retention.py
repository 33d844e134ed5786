"""Retention (docs/how-to/retention.md): terminal jobs past `retention` leave the store, a batch
at a time, and their attempt directories (logs included) leave the disk.

One batch: the store picks the candidates (terminal, past their role's age or count, never a job
that has not ended), reads every row of those that can go now with whole chain segments
(store/retention_sql.py), the rows are written to an archive file atomically, then deleted in one
transaction, then the attempt directories of the deleted jobs are removed. A crash between the
archive and the delete leaves a file the store does not name (harmless; the next run writes the
rows again). Attempt directories whose job is no longer in the store (a crash between the delete
and their removal, or, on a shared PostgreSQL store, attempts this engine ran of jobs another
engine collected) are swept by every run once they are older than the shortest `keep_days`
(`sweep`): younger than that, retention would not have taken their job either.

`corral gc` runs it once; a running engine runs it every `retention.interval_s` in its own task,
a batch per transaction so that dispatch never waits long behind it. On a shared PostgreSQL
store, one engine collects at a time: a lease (`gc_lease`, taken by compare-and-set), and the
archived heads as a compare-and-set besides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from corral.config import Config
from corral.core.ports import METRIC_BOUNDS, RetentionStore
from corral.domain.errors import Conflict, CorralError
from corral.domain.ids import new_id
from corral.runtime.audit import archive_dir
from corral.store import archive

log = logging.getLogger("corral.retention")

LEASE_S = 600.0  # a collector that died frees the lease after this long
DRY_RUN_LIMIT = 10_000  # candidates a dry run looks at
MAX_BATCH = 5_000  # candidates one batch looks at when the first ones cannot go alone
PREFETCH = 10  # batches of candidates read at once


@dataclass(frozen=True, slots=True, kw_only=True)
class GcProgress:
    """After each batch: the batch number, the jobs removed so far, the archive just written."""

    batch: int
    jobs: int
    held: int
    archive: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GcResult:
    """What one run did (or, `dry_run`, would do)."""

    dry_run: bool
    jobs: int = 0
    held: int = 0
    attempt_dirs: int = 0
    batches: int = 0
    archives: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()  # a dry run: the jobs that would go
    records: dict[str, int] = field(default_factory=dict)  # chain → records archived


def attempts_root(config: Config) -> Path:
    return config.data_dir / "attempts"


def _remove_dirs(root: Path, dirs: Sequence[str]) -> int:
    """Remove the attempt directories that lie inside `root` (never anything else)."""
    removed = 0
    base = root.resolve()
    for d in dirs:
        path = Path(d).resolve()
        if path == base or base not in path.parents or not path.is_dir():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


SWEEP_CHUNK = 500


def _leftover_candidates(root: Path, older_than: float) -> dict[str, list[Path]]:
    """Attempt directories (`<job id>.<attempt>`) last changed before `older_than`, by job."""
    found: dict[str, list[Path]] = {}
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        job_id, dot, index = entry.name.rpartition(".")
        if not dot or not index.isdigit() or not job_id:
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and entry.stat().st_mtime < older_than:
                found.setdefault(job_id, []).append(entry)
    return found


async def sweep(store: RetentionStore, config: Config, *, now: float) -> int:
    """Remove the attempt directories of jobs the store no longer has, once they are older
    than the shortest `keep_days` of any role; the number removed."""
    spec = config.settings.retention
    shortest = min([spec.default.keep_days, *(k.keep_days for k in spec.roles.values())])
    root = attempts_root(config)
    found = await anyio.to_thread.run_sync(_leftover_candidates, root, now - shortest * 86400.0)
    ids = sorted(found)
    gone: list[str] = []
    for i in range(0, len(ids), SWEEP_CHUNK):
        chunk = ids[i : i + SWEEP_CHUNK]
        known = await store.gc_known(chunk)
        gone += [str(d) for j in chunk if j not in known for d in found[j]]
    return await anyio.to_thread.run_sync(_remove_dirs, root, gone) if gone else 0


async def collect(
    store: RetentionStore,
    config: Config,
    *,
    holder: str,
    dry_run: bool = False,
    now: float | None = None,
    progress: Callable[[GcProgress], None] | None = None,
    bounds: Sequence[float] = METRIC_BOUNDS,
) -> GcResult:
    """Run retention once: every batch until nothing past retention can go."""
    spec = config.settings.retention
    sinks = [s.name for s in config.settings.events.sinks]
    at = time.time() if now is None else now
    if dry_run:
        ids = await store.gc_candidates(spec, now=at, limit=DRY_RUN_LIMIT)
        batch = await store.gc_collect(ids, sinks=sinks)
        return GcResult(
            dry_run=True,
            jobs=len(batch.jobs),
            held=batch.held,
            attempt_dirs=len(batch.dirs),
            job_ids=batch.jobs,
            records={t: b.seq - a.seq for t, (a, b) in batch.segments.items()},
        )
    if not await store.claim_gc(holder, now=time.time(), lease_s=LEASE_S):
        raise Conflict("another engine or `corral gc` is collecting now: try again later")
    try:
        result = await _batches(store, config, holder, at, sinks, bounds, progress)
        swept = await sweep(store, config, now=at)
        return dataclasses.replace(result, attempt_dirs=result.attempt_dirs + swept)
    finally:
        with contextlib.suppress(CorralError):
            await store.release_gc(holder)


async def _batches(
    store: RetentionStore,
    config: Config,
    holder: str,
    at: float,
    sinks: Sequence[str],
    bounds: Sequence[float],
    progress: Callable[[GcProgress], None] | None,
) -> GcResult:
    spec = config.settings.retention
    folder = archive_dir(config)
    jobs = dirs = batches = 0
    files: list[str] = []
    records: dict[str, int] = {}
    # Candidates are read PREFETCH batches at a time (finding them is a scan of the terminal
    # jobs); they stay candidates while the run lasts (terminal is final, `at` is fixed).
    pending: list[str] = []
    more = True
    size = spec.batch
    while True:
        if len(pending) < size and more:
            want = size * PREFETCH
            pending = await store.gc_candidates(spec, now=at, limit=want)
            more = len(pending) == want
        if not pending:
            break
        ids = pending[:size]
        batch = await store.gc_collect(ids, sinks=sinks)
        if not batch.jobs:
            if (len(ids) == len(pending) and not more) or size >= MAX_BATCH:
                break
            # every candidate of this batch has a record after one of the next candidates':
            # look at more of them at once
            size = min(size * 4, MAX_BATCH)
            continue
        size = spec.batch
        taken = set(batch.jobs)
        pending = [j for j in pending if j not in taken]
        batches += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(at))
        name = f"corral-archive-{stamp}-{batches:05d}-{new_id()[-8:]}.jsonl"
        path = await anyio.to_thread.run_sync(archive.write, folder, name, batch, time.time())
        jobs += await store.gc_remove(batch, archive=name, now=time.time(), bounds=bounds)
        dirs += await anyio.to_thread.run_sync(_remove_dirs, attempts_root(config), batch.dirs)
        files.append(str(path))
        for table, (a, b) in batch.segments.items():
            records[table] = records.get(table, 0) + b.seq - a.seq
        await store.claim_gc(holder, now=time.time(), lease_s=LEASE_S)  # renew
        if progress is not None:
            progress(GcProgress(batch=batches, jobs=jobs, held=batch.held, archive=str(path)))
    held = len(pending)  # candidates that had to stay (at least: more may not have been read)
    return GcResult(
        dry_run=False,
        jobs=jobs,
        held=held,
        attempt_dirs=dirs,
        batches=batches,
        archives=tuple(files),
        records=records,
    )


class Retainer:
    """The engine's periodic retention: every `retention.interval_s`, in its own task; a failure
    is logged and tried again at the next interval (it never stops the engine)."""

    def __init__(self, store: RetentionStore, config: Config, *, holder: str) -> None:
        self.store = store
        self.config = config
        self.holder = holder
        self.interval_s = config.settings.retention.interval_s
        self.last: GcResult | None = None

    async def run(self) -> None:
        if self.interval_s <= 0:
            return
        while True:
            await anyio.sleep(self.interval_s)
            await self.once()

    async def once(self) -> GcResult | None:
        try:
            self.last = await collect(self.store, self.config, holder=self.holder)
        except Conflict:
            return None  # another engine collects now
        except (CorralError, OSError) as err:
            log.warning("retention: %s (trying again in %.0f s)", err, self.interval_s)
            return None
        if self.last.jobs:
            log.info(
                "retention: %d job(s) archived and removed, %d attempt directories",
                self.last.jobs,
                self.last.attempt_dirs,
            )
        return self.last
