"""Idempotency keys: what a submission does when its key is already held."""

from __future__ import annotations

from typing import Literal

from corral.domain.errors import DuplicateJob, InvalidRequest
from corral.domain.models import Job
from corral.domain.states import DedupMode

KeyDecision = Literal["new", "coalesce", "supersede"]


def on_held_key(job: Job, holder: Job | None) -> KeyDecision:
    """`new` when no active job holds the key; otherwise the job's dedup mode decides:
    coalesce into the holder, supersede it (latest-wins), or refuse (DuplicateJob)."""
    if job.key is None or holder is None or holder.state.terminal:
        return "new"
    if job.dedup is DedupMode.COALESCE:
        return "coalesce"
    if job.dedup is DedupMode.REJECT:
        raise DuplicateJob(job.key, holder.id)
    if holder.id in job.after:
        raise InvalidRequest(
            f"job cannot run --after {holder.id}: it supersedes that job "
            "(latest-wins on the same key would close a cycle)"
        )
    return "supersede"
