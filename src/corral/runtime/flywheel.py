"""The knowledge flywheel in the product path (the decisions are corral/knowledge's):

- at dispatch of an agent attempt whose role says `knowledge: on` (or `ab`, for the runs of
  the treatment arm), the role's active learnings that the full-text search finds for the job's
  prompt are ranked, the best that fit the budget are appended to the agent's system prompt
  (JobOptions.knowledge, which each adapter appends: workers/agents/base.py `system_prompt`),
  and recorded as the attempt's citations, with the run's A/B arm;
- when the run ended (its report written: runtime/reporter.py), its citations get the run's
  reward (0.8 succeeded, 0.2 failed, 0.4 abandoned), which moves each cited learning's utility
  (annealed EMA), confidence and maturity, with a history line; the run's arm gets its outcome
  and tool calls (`corral knowledge stats`);
- then its trace is extracted (the rule-based extractor, or the configured one), scored by the
  rubric and written under write-on-success: a succeeded run's learnings, a failed run's
  failures; bronze waits for a human (`corral knowledge promote`), discard is not stored.

Everything here is best effort: a store that fails, or an extractor that raises, costs the run
its learnings, never its dispatch or its report."""

from __future__ import annotations

import hashlib
import importlib
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import anyio

from corral.core.ports import KnowledgeStore
from corral.domain.agents import AgentEvent
from corral.domain.errors import ConfigError, CorralError, StaleState
from corral.domain.ids import new_id
from corral.domain.knowledge import (
    Arm,
    Citation,
    KnowledgeRun,
    Learning,
    LearningChange,
    LearningStatus,
    LearningUpdate,
    Maturity,
    Provenance,
    Tier,
)
from corral.domain.models import Claimed, Job
from corral.domain.settings import Settings
from corral.knowledge import extract, lifecycle, retrieval, rubric

log = logging.getLogger("corral.knowledge")

ACTOR = "corral"
MAX_TRIES = 5  # a lost race on a learning's numbers is read and applied again
GIT_TIMEOUT_S = 5.0


def load_extractor(name: str) -> extract.Extractor:
    """`rules`, or `package.module:function`; ConfigError saying what is wrong otherwise."""
    if name == "rules":
        return extract.rules
    module, _, attr = name.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"knowledge.extractor {name!r} cannot be loaded: {err}") from None
    if not callable(found):
        raise ConfigError(f"knowledge.extractor {name!r} is not a function")
    extractor: extract.Extractor = found
    return extractor


def control_arm(job_id: str) -> bool:
    """The A/B split of a role in `ab` mode: half the jobs, by a hash of their id (stable
    across retries and engines), run without learnings."""
    return hashlib.sha256(job_id.encode()).digest()[0] % 2 == 1


def prompt_of(job: Job) -> str:
    return job.prompt or " ".join(job.command)


def head_commit(cwd: str | None) -> str | None:
    """The commit the job's working directory is at, when it is a git checkout."""
    if not cwd:
        return None
    try:
        out = subprocess.run(
            ["git", "-C", cwd, "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) in (40, 64) else None


class Flywheel:
    def __init__(
        self,
        store: KnowledgeStore,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        extractor: extract.Extractor | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.spec = settings.knowledge
        self.clock = clock
        self.extractor = extractor or load_extractor(self.spec.extractor)

    def mode(self, role: str) -> str:
        spec = self.settings.roles.get(role)
        return spec.knowledge if spec is not None else "off"

    # ---- at dispatch ---------------------------------------------------------------------

    async def inject(self, claimed: Claimed) -> Claimed:
        """The claimed attempt, its job carrying the learnings to append to the agent's system
        prompt (or unchanged); its arm and citations recorded."""
        job, attempt = claimed.job, claimed.attempt
        mode = self.mode(job.role)
        if mode == "off":
            return claimed
        now = self.clock()
        try:
            if mode == "ab" and control_arm(job.id):
                await self._record(claimed, Arm.WITHOUT, "control", [], now)
                return claimed
            prompt = prompt_of(job)
            found = await self.store.search_learnings(
                prompt, tenant=job.tenant, role=job.role, limit=self.spec.candidates
            )
            ranked = retrieval.rank(found, prompt, now=now, w_sim=self.spec.similarity_weight)
            chosen = retrieval.budget(
                ranked, max_tokens=self.spec.max_tokens, max_learnings=self.spec.max_learnings
            )
            if not chosen.chosen:
                await self._record(claimed, Arm.WITHOUT, "none_found", [], now)
                return claimed
            citations = [
                Citation(
                    learning_id=r.learning.id,
                    job_id=job.id,
                    attempt=attempt.index,
                    at=now,
                    rank=i,
                    score=r.score,
                )
                for i, r in enumerate(chosen.chosen, start=1)
            ]
            await self._record(claimed, Arm.WITH, "injected", citations, now)
        except CorralError as err:
            log.warning("learnings for job %s: %s (dispatched without)", job.id, err)
            return claimed
        options = job.options.with_(knowledge=chosen.text)
        return replace(claimed, job=job.with_(options=options))

    async def _record(
        self, c: Claimed, arm: Arm, reason: str, citations: Sequence[Citation], now: float
    ) -> None:
        run = KnowledgeRun(
            job_id=c.job.id,
            attempt=c.attempt.index,
            tenant=c.job.tenant,
            role=c.job.role,
            arm=arm,
            reason=reason,
            injected=len(citations),
            started_at=now,
        )
        await self.store.record_injection(run, citations)

    # ---- when the run ended --------------------------------------------------------------

    async def settle(self, job: Job, events: Sequence[AgentEvent]) -> None:
        """Reward the learnings the run was given, then extract what it teaches."""
        if not events:
            return  # not an agent run, or one that never started: nothing to learn from
        try:
            await self._reward(job, events)
        except CorralError as err:
            log.warning("rewarding the learnings of job %s: %s", job.id, err)
        if not self.spec.extract:
            return
        try:
            await self._extract(job, events)
        except CorralError as err:
            log.warning("learnings of job %s: %s", job.id, err)
        except Exception as err:  # a configured extractor's bug: the run keeps its report
            log.warning("extractor %s on job %s: %r", self.spec.extractor, job.id, err)

    async def _reward(self, job: Job, events: Sequence[AgentEvent]) -> None:
        r = lifecycle.run_reward(job.state.value)
        succeeded = job.state.value == "SUCCEEDED"
        tool_calls = sum(len(e.tool_calls) for e in events)
        for _ in range(MAX_TRIES):
            now = self.clock()
            cites = await self.store.citations(job_id=job.id)
            pending = {c.learning_id for c in cites if c.reward is None}
            updates: list[LearningUpdate] = []
            if r is not None:
                for learning_id in sorted(pending):
                    before = await self.store.get_learning(learning_id)
                    fb = lifecycle.reward(
                        before,
                        r,
                        now=now,
                        job_id=job.id,
                        actor=ACTOR,
                        reason=f"run {job.id} ended {job.state.value} (reward {r:g})",
                    )
                    updates.append(
                        LearningUpdate(before=before, after=fb.learning, change=fb.change)
                    )
            try:
                await self.store.settle_run(
                    job.id, succeeded=succeeded, tool_calls=tool_calls, reward=r, updates=updates
                )
                return
            except StaleState:
                continue  # another writer moved one of them: read again
        log.warning("rewarding the learnings of job %s: lost %d races, gave up", job.id, MAX_TRIES)

    async def _extract(self, job: Job, events: Sequence[AgentEvent]) -> None:
        trace = extract.RunTrace(
            job_id=job.id,
            role=job.role,
            prompt=prompt_of(job),
            state=job.state.value,
            events=list(events),
        )
        kept = extract.gate(trace, self.extractor(trace))
        if not kept:
            return
        commit = await anyio.to_thread.run_sync(head_commit, job.cwd)
        now = self.clock()
        attempt = events[-1].attempt
        for c in kept:
            s = rubric.score(c)
            if s.tier is Tier.DISCARD:
                continue
            status = LearningStatus.PENDING if s.needs_human else LearningStatus.ACTIVE
            item = Learning(
                id=new_id(),
                tenant=job.tenant,
                role=job.role,
                kind=c.kind,
                title=c.title,
                body=c.body,
                digest=rubric.digest(c.kind, c.title, c.body),
                score=s.raw,
                tier=s.tier,
                confidence=s.confidence,
                utility=lifecycle.INITIAL_UTILITY,
                maturity=Maturity.PROVISIONAL,
                status=status,
                provenance=Provenance(job_id=job.id, attempt=attempt, commit=commit),
                created_at=now,
                updated_at=now,
            )
            change = LearningChange(
                learning_id=item.id,
                at=now,
                action="created",
                actor=ACTOR,
                reason=f"extracted from run {job.id} ({job.state.value}); {s.tier.value}"
                + (", waits for a human" if s.needs_human else ""),
                job_id=job.id,
                utility_after=item.utility,
                confidence_after=item.confidence,
                maturity_after=item.maturity.value,
                status_after=status.value,
            )
            await self.store.add_learning(item, change)
