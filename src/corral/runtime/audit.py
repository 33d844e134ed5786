"""The audit chain around the store: its key, the engine's signed checkpoints, verification
against them, and the refusal to serve on a store whose append-only triggers are gone
(docs/explanation/audit.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from corral.config import Config
from corral.core.ports import ArchivedAudit, AuditReport, AuditStore, ChainHead
from corral.domain.errors import CorralError, StoreError
from corral.store import archive, checkpoints
from corral.store.chain import Problem
from corral.workers.sealing import KeyFile

log = logging.getLogger("corral.audit")

POLL_S = 1.0  # how often the engine looks at the chains' heads (one small read)


def audit_key(config: Config) -> KeyFile:
    """The audit chain's key: `<data dir>/audit.key` (or `audit.key_file`), created on first
    use, 0600 (the same mechanism as the sealing key)."""
    return KeyFile(config.audit_key)


async def refuse_without_triggers(store: AuditStore) -> None:
    """StoreError when an append-only trigger is missing or disabled: the engine does not
    serve on a store whose history can be changed in place without going around anything."""
    missing = await store.missing_triggers()
    if missing:
        raise StoreError(
            f"the store's append-only trigger{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} {'are' if len(missing) > 1 else 'is'} missing or disabled: "
            "refusing to serve (see what changed with `corral audit verify`, then put them back "
            "with `corral audit restore-triggers`)"
        )


async def refuse_without_key(store: AuditStore, config: Config) -> None:
    """StoreError when records were hashed with an audit key and it is gone: a new key would
    make every one of them fail verification (restore it from a backup)."""
    key = audit_key(config)
    if key.get(create=False) is not None:
        return
    keyed = sorted(c for c, h in (await store.audit_heads()).items() if h.keyed_from is not None)
    if keyed:
        raise StoreError(
            f"the audit key {key} is missing, but the records of {', '.join(keyed)}"
            " were hashed with one: refusing to serve (restore it from your backup:"
            " docs/explanation/audit.md)"
        )


async def verify(store: ArchivedAudit, config: Config) -> AuditReport:
    """The store's chains checked against the key and the data directory's checkpoints, from
    where retention's archive ends; and the archive files themselves, when they are there."""
    key = audit_key(config).get(create=False)
    marks, problems = checkpoints.read(config.audit_checkpoints, key)
    report = await store.verify_audit(marks)
    archived, missing, archive_problems = await verify_archives(store, config, key)
    found = (*problems, *report.problems, *archive_problems)
    return dataclasses.replace(
        report,
        ok=not found,
        problems=tuple(found),
        first_bad=found[0] if found else None,
        checkpoints=len(marks),
        archived=archived,
        archives_missing=missing,
    )


async def verify_archives(
    store: ArchivedAudit, config: Config, key: bytes | None
) -> tuple[int, int, list[Problem]]:
    """Each archive file the store recorded: its segments link one to the next and the last
    ends where the store's chains now start; a file found on disk is checked row by row.
    (records checked, files missing, problems)."""
    checked, missing, problems = 0, 0, list[Problem]()
    folder = archive_dir(config)
    reached: dict[str, ChainHead] = {}
    for record in await store.archives():
        for chain, (start, end) in record.segments.items():
            before = reached.get(chain, ChainHead(0, ""))
            if (start.seq, start.hash) != (before.seq, before.hash):
                problems.append(
                    (
                        f"archive {record.file}",
                        chain,
                        f"its {chain} segment starts at seq {start.seq}, but the archive"
                        f" before ends at seq {before.seq}",
                    )
                )
            reached[chain] = end
        path = folder / record.file
        if not path.is_file():
            missing += 1
            continue
        n, found = archive.verify_file(path, record.segments, key)
        checked += n
        problems += found
    for chain, head in (await store.archived_heads()).items():
        last = reached.get(chain, ChainHead(0, ""))
        if (head.seq, head.hash) != (last.seq, last.hash):
            problems.append(
                (
                    chain,
                    str(head.seq),
                    f"the store says {chain} was archived up to seq {head.seq}, but its"
                    f" archives end at seq {last.seq}",
                )
            )
    return checked, missing, problems


def archive_dir(config: Config) -> Path:
    """Where retention writes its archive files (`retention.archive_dir`, else the data
    directory's `archive/`)."""
    configured = config.settings.retention.archive_dir
    return Path(configured) if configured else config.data_dir / "archive"


class Checkpointer:
    """Writes a signed checkpoint of every chain that moved: after `every_records` records on
    one chain or `every_s` seconds, whichever comes first, and at a clean stop (`flush`)."""

    def __init__(
        self, store: AuditStore, config: Config, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.path = config.audit_checkpoints
        self.key = audit_key(config)
        self.every_records = config.audit.checkpoint_every_records
        self.every_s = config.audit.checkpoint_every_s
        self.clock = clock
        self._written: dict[str, tuple[int, str]] = {}
        self._at = clock()
        self._key_bytes: bytes | None = None

    async def start(self) -> list[str]:
        """Read the newest checkpoints; a warning for each chain whose head is now behind its
        checkpoint (records removed with the head rewound)."""
        marks, _ = checkpoints.read(self.path, self.key.get(create=False))
        newest = checkpoints.latest(marks)
        self._written = {c: (m.seq, m.hash) for c, m in newest.items()}
        heads = await self.store.audit_heads()
        out = []
        for chain, mark in sorted(newest.items()):
            head = heads.get(chain, ChainHead(0, ""))
            if head.seq < mark.seq:
                out.append(
                    f"audit chain {chain}: the head is seq {head.seq} but the checkpoint"
                    f" at {mark.when} says seq {mark.seq}: records were removed"
                    " (run `corral audit verify`)"
                )
        return out

    async def tick(self, *, force: bool = False) -> int:
        """Write what is due; the number of checkpoints written."""
        heads = await self.store.audit_heads()
        moved = {
            c: h for c, h in heads.items() if h.seq and self._written.get(c) != (h.seq, h.hash)
        }
        if not moved:
            return 0
        now = self.clock()
        due = (
            force
            or now - self._at >= self.every_s
            or any(
                h.seq - self._written.get(c, (0, ""))[0] >= self.every_records
                for c, h in moved.items()
            )
        )
        if not due:
            return 0
        n = checkpoints.append(self.path, self._key(), moved, now)
        self._written.update({c: (h.seq, h.hash) for c, h in moved.items()})
        self._at = now
        return n

    def _key(self) -> bytes:
        """The key, read once (the store created it with the first keyed record)."""
        if self._key_bytes is None:
            self._key_bytes = self.key.load(create=True)
        return self._key_bytes

    async def run(self) -> None:
        while True:
            await anyio.sleep(POLL_S)
            try:
                await self.tick()
            except (CorralError, OSError) as err:  # the store or the disk: try again later
                log.warning("audit checkpoint: %s", err)

    async def flush(self) -> None:
        """The clean stop's checkpoint of every chain that moved since the last one."""
        try:
            await self.tick(force=True)
        except (CorralError, OSError) as err:
            log.warning("audit checkpoint at stop: %s", err)
