"""What `corral wait` and `corral submit --wait` learn about a job beyond its row: whether an
engine serves it, and the facts of its wait (scheduler/waiting.py turns them into words)."""

from __future__ import annotations

from typing import Any

from corral.config import Config
from corral.core.ports import EngineRegistry, JobGovernance
from corral.domain.models import Job, JobEvent
from corral.domain.states import JobState
from corral.policy.prerun import JobRef
from corral.runtime.assembly import is_shared
from corral.runtime.control import poke
from corral.runtime.servelock import engine_holds
from corral.scheduler.waiting import WaitFacts

# An engine heart-beats every 5 s; one silent for three beats is gone (runtime/engine.py).
LIVE_ENGINE_S = 15.0


async def engine_serving(cfg: Config, store: EngineRegistry, now: float) -> bool:
    """Whether an engine serves this data directory — it holds the directory's lock (also while
    it starts, before its socket answers) or its socket answers — or, on a shared store, any
    engine heart-beats: a job submitted here will run."""
    if engine_holds(cfg.data_dir) or poke(cfg.data_dir, "ping") is not None:
        return True
    return is_shared(cfg) and bool(await store.live_engines(since=now - LIVE_ENGINE_S))


class Watcher:
    """Gathers the facts of one job's wait, reading only what is new each time."""

    def __init__(self, cfg: Config, store: JobGovernance) -> None:
        self.cfg = cfg
        self.store = store
        self._seen = 0  # the last timeline line read
        self._last: JobEvent | None = None

    async def facts(self, job: Job, now: float, *, engine: bool) -> WaitFacts:
        for event_id, event in await self.store.events(job.id, after_id=self._seen):
            self._seen, self._last = event_id, event
        queued = job.state is JobState.QUEUED
        ref = JobRef.of(job)
        pauses = (
            [p for p in await self.store.pauses(active_only=True) if ref.matches(p.scope, p.target)]
            if queued
            else []
        )
        ahead = await self.store.queued_ahead(job) if queued and not job.deps_pending else 0
        snap = _snapshot(self.cfg) if engine and queued else {}
        permits = snap.get("permits") or {}
        return WaitFacts(
            job=job,
            now=now,
            engine=engine,
            ahead=ahead,
            pauses=pauses,
            refusal=self._last if self._last and self._last.kind == "permit_rejected" else None,
            breakers={b["name"]: b for b in snap.get("breakers") or () if "name" in b},
            full_roles=frozenset(permits.get("full_roles") or ()),
            full_envs=frozenset(permits.get("full_envs") or ()),
            data_dir=str(self.cfg.data_dir),
        )


def _snapshot(cfg: Config) -> dict[str, Any]:
    """The engine's live view of the core (breakers, saturated scopes), if it answers."""
    answer = poke(cfg.data_dir, "core", timeout=2.0, core_op="snapshot")
    result = (answer or {}).get("result") if (answer or {}).get("ok") else None
    return result if isinstance(result, dict) else {}
