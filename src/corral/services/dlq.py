"""The dead-letter queue: jobs whose retries ran out, listed, requeued with a fresh attempt
budget, or purged (their records, attempts and logs stay)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.config import Config
from corral.core.ports import JobGovernance, JobQuery, Operations
from corral.domain.models import Job
from corral.services import Notify, Wake
from corral.services.submissions import active_submissions, submissions

PURGE_ALL_CAP = 1_000_000  # dead-lettered jobs `purge --all` reads at most


def dead_lettered(limit: int) -> JobQuery:
    """The query of dead-lettered jobs not yet requeued or purged."""
    return JobQuery(dead_lettered_unresolved=True, limit=limit)


async def requeue(
    store: Operations, local: Config, ref: str, *, wake: Wake, notify: Notify | None = None
) -> Job:
    """A fresh job with the dead-lettered one's spec, admitted against the engine's
    configuration."""
    svc, _ = await active_submissions(store, local, notify)
    fresh = await svc.dlq_requeue(ref)
    wake("wake")
    return fresh


async def purge(
    store: JobGovernance, config: Config, refs: Sequence[str], *, every: bool = False
) -> list[str]:
    """Purge the jobs named (each once), and with `every` every dead-lettered one; their ids."""
    chosen = list(refs)
    if every:
        chosen += [j.id for j in await store.list_jobs(dead_lettered(PURGE_ALL_CAP))]
    svc = submissions(store, config)
    return [(await svc.dlq_purge(r)).id for r in dict.fromkeys(chosen)]
