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
  failures; bronze waits for a human (`corral knowledge promote`), discard is not stored;
- with `knowledge.extractor: agent:ROLE`, extracting is an ordinary job of that role (submitted
  like any other, so governed like any other: permit, caps, policies), whose prompt carries the
  run (knowledge/agentextract.py) and whose working directory is a fresh folder of the data
  directory; when that job ends, the candidates it wrote there are validated and go through the
  same gate and rubric, with the provenance Corral recorded when it submitted the job. The
  extractor's own runs are never extracted (no loop), and whatever becomes of the job (denied,
  failed, a file that is not valid) costs nothing but those learnings.

Everything here is best effort: an extractor that raises costs the run its learnings, never
its dispatch or its report. A store that fails, or an engine that dies, after the run's report
and before its learnings are settled costs nothing: the run was marked due before its report
(`mark_due`), the mark is cleared only once every step went through, and the reporter settles
the runs whose mark outlived `LOST_AFTER_S` again (every step is idempotent: a citation is
rewarded once, a learning's content is stored once, an extractor job is submitted under a
key)."""

from __future__ import annotations

import hashlib
import importlib
import logging
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import anyio

from corral.core.ports import JobStore, KnowledgeStore
from corral.domain.agents import AgentEvent
from corral.domain.errors import ConfigError, CorralError, NotFound, StaleState
from corral.domain.ids import new_id
from corral.domain.knowledge import (
    Arm,
    Candidate,
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
from corral.domain.models import PRIORITY_BACKLOG, Claimed, Job, JobOptions, JobSpec
from corral.domain.settings import Settings
from corral.knowledge import agentextract, extract, lifecycle, retrieval, rubric
from corral.workers.agentfiles import read_agent_file

log = logging.getLogger("corral.knowledge")

ACTOR = "corral"
MAX_TRIES = 5  # a lost race on a learning's numbers is read and applied again
GIT_TIMEOUT_S = 5.0
LOST_AFTER_S = 60.0  # a settle mark this old belongs to no settle under way: it was lost
AGENT = "agent:"  # `knowledge.extractor: agent:ROLE`

# Submits a job as any edge does (services/submissions.py, wired by `corral serve`); its id.
Submit = Callable[[JobSpec], Awaitable[str]]


class FlywheelStore(KnowledgeStore, JobStore, Protocol):
    """The learnings, and the jobs an agent extractor's run is read against."""


def load_extractor(name: str) -> extract.Extractor:
    """`rules`, or `package.module:function`; ConfigError saying what is wrong otherwise (an
    `agent:ROLE` extractor is a job, not a function: Flywheel submits it)."""
    if name == "rules" or name.startswith(AGENT):
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


def provenance_of(extract_of: str) -> tuple[str, int, str | None]:
    """The run an extractor job reads, as the flywheel wrote it: job id, attempt, commit."""
    job_id, _, rest = extract_of.partition("/")
    attempt, _, commit = rest.partition("/")
    if not job_id or not attempt.isdigit():
        raise ValueError(f"not a run: {extract_of!r}")
    return job_id, int(attempt), commit or None


def read_output(folder: str) -> bytes:
    """The extractor's file (an agent wrote it: workers/agentfiles.py), at most one byte past
    the limit `agentextract.parse` refuses."""
    return read_agent_file(Path(folder) / agentextract.OUTPUT, agentextract.MAX_FILE_BYTES)


class Flywheel:
    def __init__(
        self,
        store: FlywheelStore,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        extractor: extract.Extractor | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.spec = settings.knowledge
        self.clock = clock
        name = self.spec.extractor
        # the role whose jobs extract (`agent:ROLE`), or None: a function does, in the engine
        self.agent_role = name[len(AGENT) :] if name.startswith(AGENT) else None
        self.extractor = extractor or load_extractor(name)
        self.workdir = workdir  # where each extractor job gets its folder
        self.submit: Submit | None = None  # wired by the edge that serves (`corral serve`)

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

    @staticmethod
    def due(job: Job, events: Sequence[AgentEvent]) -> bool:
        """Whether the run's end has learnings to settle: an agent run, or an extractor's."""
        return job.options.extract_of is not None or bool(events)

    async def mark_due(self, runs: Sequence[tuple[Job, Sequence[AgentEvent]]]) -> None:
        """Mark the runs about to be reported whose learnings are to settle (before their
        reports: a report is written once, so a settle lost after it is found by its mark)."""
        due = [job.id for job, events in runs if self.due(job, events)]
        await self.store.mark_settle_due(due, self.clock())

    async def settle(self, job: Job, events: Sequence[AgentEvent]) -> None:
        """Reward the learnings the run was given, then extract what it teaches (an
        extractor job's end: collect what it wrote, whether it ran or not); then clear the
        run's mark, unless the store failed a step (the mark brings the run back)."""
        if not self.due(job, events):
            return  # not an agent run, or one that never started: nothing to learn from
        try:
            complete = await self._settle(job, events)
        except CorralError as err:
            log.warning("learnings of job %s: %s (settled again later)", job.id, err)
            return
        if complete:
            try:
                await self.store.settled(job.id)
            except CorralError as err:  # settled again later: every step is idempotent
                log.warning("learnings of job %s settled, not recorded so: %s", job.id, err)

    async def _settle(self, job: Job, events: Sequence[AgentEvent]) -> bool:
        """The steps of `settle`; False when the store failed one."""
        if job.options.extract_of is not None:  # an extractor's run: never extracted itself
            return await self._extracted(job, job.options.extract_of)
        complete = True
        try:
            await self._reward(job, events)
        except NotFound as err:  # gone for good (retention): nothing to come back for
            log.warning("rewarding the learnings of job %s: %s", job.id, err)
        except CorralError as err:
            log.warning("rewarding the learnings of job %s: %s", job.id, err)
            complete = False
        if not self.spec.extract:
            return complete
        try:
            if self.agent_role is not None:
                await self._ask_agent(job, events)
            else:
                await self._extract(job, events)
        except CorralError as err:
            log.warning("learnings of job %s: %s", job.id, err)
            return isinstance(err, NotFound)
        except (OSError, ValueError) as err:
            log.warning("learnings of job %s: %s", job.id, err)
        except Exception as err:  # a configured extractor's bug: the run keeps its report
            log.warning("extractor %s on job %s: %r", self.spec.extractor, job.id, err)
        return complete

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

    @staticmethod
    def _trace(job: Job, events: Sequence[AgentEvent]) -> extract.RunTrace:
        return extract.RunTrace(
            job_id=job.id,
            role=job.role,
            prompt=prompt_of(job),
            state=job.state.value,
            events=list(events),
        )

    async def _extract(self, job: Job, events: Sequence[AgentEvent]) -> None:
        trace = self._trace(job, events)
        kept = extract.gate(trace, self.extractor(trace))
        if not kept:
            return
        commit = await anyio.to_thread.run_sync(head_commit, job.cwd)
        await self._write(job, kept, attempt=events[-1].attempt, commit=commit)

    async def _ask_agent(self, job: Job, events: Sequence[AgentEvent]) -> None:
        """Submit the extractor job for this run (none for a run of the extractor's role, nor
        for one whose end writes nothing)."""
        trace = self._trace(job, events)
        if job.role == self.agent_role or not agentextract.worth_asking(trace):
            return
        if self.submit is None or self.workdir is None:
            log.warning("job %s: no extractor job (nothing here submits jobs)", job.id)
            return
        commit = await anyio.to_thread.run_sync(head_commit, job.cwd)
        folder = self.workdir / job.id
        await anyio.to_thread.run_sync(lambda: folder.mkdir(parents=True, exist_ok=True))
        spec = JobSpec(
            prompt=agentextract.prompt(trace),
            role=self.agent_role or "",
            tenant=job.tenant,
            priority=PRIORITY_BACKLOG,
            cwd=str(folder),
            key=f"knowledge-extract:{job.id}",
            options=JobOptions(
                submitted_by=ACTOR,
                extract_of=f"{job.id}/{events[-1].attempt}/{commit or ''}",
            ),
        )
        extractor = await self.submit(spec)
        log.info("job %s: learnings extracted by job %s", job.id, extractor)

    async def _extracted(self, job: Job, extract_of: str) -> bool:
        """The extractor job ended (or was refused): its learnings, then its folder removed
        (the folder Corral made for it, nothing else); False, the folder kept, when the store
        failed (the next try reads the folder again)."""
        try:
            await self._collect(job, extract_of)
        except CorralError as err:
            log.warning("learnings of extractor job %s: %s", job.id, err)
            if not isinstance(err, NotFound):  # the run it read is gone for good: done
                return False
        except (OSError, ValueError) as err:
            log.warning("learnings of extractor job %s: %s", job.id, err)
        folder = Path(job.cwd) if job.cwd else None
        if folder is not None and self.workdir is not None and folder.parent == self.workdir:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))
        return True

    async def _collect(self, job: Job, extract_of: str) -> None:
        """The extractor job ended: its file's valid candidates, gated by the run it read."""
        source_id, attempt, commit = provenance_of(extract_of)
        if job.state.value != "SUCCEEDED" or job.cwd is None:
            log.info("extractor job %s ended %s: no learnings", job.id, job.state.value)
            return
        source = await self.store.get_job(source_id)
        if source.tenant != job.tenant:
            raise ValueError(f"extractor job {job.id} is not of run {source.id}'s tenant")
        parsed = agentextract.parse(await anyio.to_thread.run_sync(read_output, job.cwd))
        for problem in parsed.problems:
            log.warning("extractor job %s: %s", job.id, problem)
        kept = extract.gate(self._trace(source, ()), parsed.candidates)
        if kept:
            await self._write(source, kept, attempt=attempt, commit=commit, via=job.id)

    async def _write(
        self,
        job: Job,
        kept: Sequence[Candidate],
        *,
        attempt: int,
        commit: str | None,
        via: str | None = None,
    ) -> None:
        """Score the kept candidates of `job`'s run and store those the rubric keeps."""
        now = self.clock()
        by = f" by extractor job {via}" if via else ""
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
                reason=f"extracted from run {job.id} ({job.state.value}){by}; {s.tier.value}"
                + (", waits for a human" if s.needs_human else ""),
                job_id=job.id,
                utility_after=item.utility,
                confidence_after=item.confidence,
                maturity_after=item.maturity.value,
                status_after=status.value,
            )
            await self.store.add_learning(item, change)
