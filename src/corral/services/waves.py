"""The FIRE loop (docs/how-to/epics.md): the engine drives every running epic
wave by wave.

- Find: the open tasks whose dependencies passed (corral.waves.rules.unblocked).
- Ignite: the wave's checkpoint first (store `begin_wave`: the tasks it takes, each try
  counted), then one fresh agent job per task through the normal submit path — permits, caps,
  governance — in its own git worktree of the target repository on its own branch, never
  resuming a session. Its job id is saved as soon as it is submitted; its idempotency key
  (epic, task, try) makes a resubmission after a crash coalesce into the live job.
- Reap: the task's checks in the worktree, then the council's judges (each a job writing
  `verdict.json`; only the verdict travels); the gate (rules.gate) decides.
- Ratchet: Corral commits each passing try's work onto the epic branch in the epic's task
  order (a trailer makes each commit once); a passed task never reopens.
- Escalate: a failed try is retried next wave within its bound; then the task's
  `on_exhausted` steps (services/escalate.py: re-decomposed, or handed to a human), else
  struck; a council that disagrees across vendors escalates the task to a human.

A settled task's worktrees and branches are removed (escalated ones wait for their decision),
and every one of the epic's when it ends.

The kill switch and a cancel are checked every wave. An engine that crashes mid-wave resumes it
from the checkpoint: the submitted jobs are waited for, not submitted again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from corral.config import Config
from corral.core.ports import Store
from corral.domain.epics import EpicRecord, EpicState, TaskRecord, TaskState, WaveRecord
from corral.domain.errors import Conflict, CorralError, InvalidRequest, StaleState
from corral.domain.governance import ScopeKind
from corral.domain.models import Job, JobOptions, JobSpec
from corral.domain.states import JobState
from corral.policy.redact import Redactor
from corral.services import Wake
from corral.services.escalate import Escalations, exhausted
from corral.services.submissions import Submissions, submissions
from corral.services.waveparts import (
    VERDICT_FILE,
    epic_root,
    judge_prompt,
    known_secrets,
    start_file,
    task_brief,
    verdict_of,
    worker_prompt,
)
from corral.waves import rules
from corral.waves.epic import EpicSpec, TaskSpec, parse
from corral.waves.rules import Gate, JudgeVerdict
from corral.workers import gitrepo

log = logging.getLogger("corral.waves")

CHECK_TIMEOUT_S = 600.0  # one check command
LEASE_S = 30.0  # the epics' lease: renewed every third of it


class _Cancelled(Exception):
    """The epic was asked to stop while a wave waited."""


class WaveRunner:
    """Drives every running epic of the store, one task group per epic, inside the engine."""

    def __init__(
        self,
        store: Store,
        config: Config,
        *,
        wake: Wake,
        clock: Callable[[], float] = time.time,
        poll_s: float | None = None,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.wake = wake
        self.clock = clock
        # Who drives the epics on a store engines share: one engine at a time holds the `epics`
        # lease. None: the data directory's only engine (no lease: no write to keep one).
        self.holder = holder
        self._down = False  # the store did not answer the last look
        self.poll_s = poll_s if poll_s is not None else config.settings.scheduler.poll_interval_s
        self._driving: set[str] = set()
        # A check's output is kept on the task: the secrets the engine knows (its workers' API keys
        # and variables, its own credential-like variables) and credential shapes are redacted.
        self.redact = Redactor(known_secrets(config))
        self._subs: Submissions | None = None
        self.escalations = Escalations(self)

    @property
    def subs(self) -> Submissions:
        if self._subs is None:
            self._subs = submissions(self.store, self.config)
        return self._subs

    async def run(self) -> None:
        """Look for running epics every poll interval and drive each one not yet driven. On a
        shared store only while this engine holds the epics' lease (lost: stop driving)."""
        if self.holder is None:  # this data directory's only engine (its serve lock)
            async with anyio.create_task_group() as tg:
                await self._look(tg)
        while True:
            if await self._claim():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._keep_lease, tg.cancel_scope)
                    await self._look(tg)
            await anyio.sleep(self.poll_s)

    async def _claim(self) -> bool | None:
        """Took or renewed the lease (True), another engine holds it (False), the store did not
        answer (None)."""
        assert self.holder is not None
        try:
            got = await self.store.claim_epics(self.holder, now=self.clock(), lease_s=LEASE_S)
        except (CorralError, OSError) as err:  # a store outage: the lease is tried again later
            self._outage(err)
            return None
        self._outage(None)
        return got

    async def _keep_lease(self, scope: anyio.CancelScope) -> None:
        held_at = self.clock()
        while True:
            await anyio.sleep(LEASE_S / 3)
            got = await self._claim()
            if got:
                held_at = self.clock()
            if got is False or self.clock() - held_at >= LEASE_S:
                log.warning("epics: lease lost; another engine may drive the epics now")
                scope.cancel()
                return

    async def _look(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                epics = await self.store.list_epics(running=True, limit=1000)
                self._outage(None)
            except (CorralError, OSError) as err:  # a store outage: look again later
                self._outage(err)
                epics = []
            for epic in epics:
                if epic.id not in self._driving:
                    self._driving.add(epic.id)
                    tg.start_soon(self._drive_guarded, epic.id)
            await anyio.sleep(self.poll_s)

    def _outage(self, err: BaseException | None) -> None:
        """Say once that the store does not answer, and once that it does again."""
        if err is not None and not self._down:
            log.warning("epics: the store does not answer (%s); looking again", err)
        elif err is None and self._down:
            log.info("epics: the store answers again")
        self._down = err is not None

    async def _drive_guarded(self, epic_id: str) -> None:
        try:
            await self.drive(epic_id)
        except Exception:  # one epic's trouble never stops the engine: it is looked at again
            log.exception("epic %s: the wave loop failed; it resumes on the next look", epic_id)
            await anyio.sleep(self.poll_s)
        finally:
            self._driving.discard(epic_id)

    async def drive(self, epic_id: str) -> None:
        """Run the epic's waves until it ends (or a step fails: it is resumed later)."""
        while True:
            epic = await self.store.get_epic(epic_id)
            if epic.state.terminal:
                return
            spec = parse(epic.spec)
            tasks = await self.store.epic_tasks(epic_id)
            try:
                if epic.cancel_requested is not None:
                    raise _Cancelled
                await self._kill_switch(epic, spec)
                running = [t for t in tasks if t.state is TaskState.RUNNING]
                if not running:
                    if await self.escalations.step(epic, spec, tasks):
                        continue  # a step moved on (or the plan changed): look again
                    tasks = await self.escalations.decisions(epic, spec, tasks)
                    await self._sweep(epic, tasks)
                    ended, waiting = await self._settle(epic, spec, tasks)
                    if ended:
                        return
                    if waiting:  # only a human's decision on an escalated task is left
                        await anyio.sleep(self.poll_s)
                        continue
                    epic, running = await self._begin_wave(epic, spec, tasks)
                await self._wave(epic, spec, running)
            except _Cancelled:
                await self._cancel(epic_id)
                return
            except gitrepo.GitError as err:
                await self._fail(epic_id, f"git: {err}")
                return

    async def _kill_switch(self, epic: EpicRecord, spec: EpicSpec) -> None:
        """A kill switch over the epic (global, its tenant, a role of its tasks, judges or
        decomposer) stops it at the wave boundary."""
        roles = {t.role for t in spec.tasks} | set(spec.council.roles)
        if spec.decomposer is not None:
            roles.add(spec.decomposer)
        for ks in await self.store.kill_switches(active_at=self.clock()):
            if (
                ks.scope is ScopeKind.GLOBAL
                or (ks.scope is ScopeKind.TENANT and ks.target == epic.tenant)
                or (ks.scope is ScopeKind.ROLE and ks.target in roles)
            ):
                await self.store.cancel_epic(
                    epic.id, f"kill switch {ks.id}: {ks.reason}", self.clock()
                )
                raise _Cancelled

    async def _settle(
        self, epic: EpicRecord, spec: EpicSpec, tasks: Sequence[TaskRecord]
    ) -> tuple[bool, bool]:
        """Between waves: block what can never run, and end the epic when nothing is left;
        (ended, waiting for a human only)."""
        states = {t.task_id: t.state for t in tasks}
        now = self.clock()
        for t in tasks:
            if rules.block_all(spec, states)[t.task_id] is not t.state:
                await self.store.save_task(
                    t.with_(state=TaskState.BLOCKED, updated_at=now), expect=t.state
                )
        states = rules.block_all(spec, states)
        end = rules.epic_end(spec, states, epic.wave)
        if end is None:
            return False, not rules.unblocked(spec, states)
        counts = {s.value: sum(1 for v in states.values() if v is s) for s in TaskState}
        reason = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        await self.store.end_epic(epic.id, end, f"{reason} after {epic.wave} waves", now)
        await self._drop_lead(epic)
        await self._sweep(epic, tasks, ended=True)
        return True, False

    async def _begin_wave(
        self, epic: EpicRecord, spec: EpicSpec, tasks: Sequence[TaskRecord]
    ) -> tuple[EpicRecord, list[TaskRecord]]:
        """Find and the checkpoint: the wave's tasks taken, each try counted, in one write (a
        task keeps its last try's verdict until this try's gate replaces it)."""
        states = {t.task_id: t.state for t in tasks}
        by_id = {t.task_id: t for t in tasks}
        now = self.clock()
        taken = [
            by_id[i].with_(
                state=TaskState.RUNNING,
                attempts=by_id[i].attempts + 1,
                job_id=None,
                judges=(),
                updated_at=now,
            )
            for i in rules.unblocked(spec, states)
        ]
        wave = WaveRecord(
            epic_id=epic.id,
            wave=epic.wave + 1,
            started_at=now,
            tasks={t.task_id: t.attempts for t in taken},
        )
        await self.store.begin_wave(wave, taken, now)
        log.info("epic %s: wave %d takes %s", epic.id, wave.wave, ", ".join(wave.tasks))
        return epic.with_(wave=wave.wave), taken

    async def _wave(self, epic: EpicRecord, spec: EpicSpec, running: Sequence[TaskRecord]) -> None:
        """Ignite and reap every task of the wave at once, then the ratchet in task order."""
        try:
            async with anyio.create_task_group() as tg:
                for t in running:
                    tg.start_soon(self._try, epic, spec, t)
        except BaseExceptionGroup as group:  # the tries' own: a stop wins, a lone git error next
            if group.subgroup(_Cancelled) is not None:
                raise _Cancelled from None
            git, rest = group.split(gitrepo.GitError)
            if git is not None and rest is None:
                raise git.exceptions[0] from None
            raise
        head = await self._ratchet(epic, spec)
        tasks = await self.store.epic_tasks(epic.id)
        wave = (await self.store.epic_waves(epic.id))[-1]
        results = {t.task_id: t.state.value for t in tasks if t.task_id in wave.tasks}
        await self.store.end_wave(epic.id, wave.wave, results=results, head=head, at=self.clock())

    # -- one try: ignite, reap, gate ------------------------------------------------------------

    def work_dir(self, epic: EpicRecord, t: TaskRecord) -> Path:
        return epic_root(self.config, epic.id) / "work" / f"{t.task_id}-{t.attempts}"

    def _marker(self, epic: EpicRecord, t: TaskRecord) -> str:
        return f"{epic.id}/{t.task_id}/{t.attempts}"

    async def _worktree(self, epic: EpicRecord, t: TaskRecord) -> tuple[Path, str]:
        """The try's worktree (made from the epic branch's head once) and its start commit."""
        work = self.work_dir(epic, t)
        started = start_file(work)
        if not started.exists():  # recorded first: a resumed try diffs against its own start
            work.parent.mkdir(parents=True, exist_ok=True)
            start = await gitrepo.commit_of(Path(epic.repo), epic.branch)
            started.write_text(start)
        start = started.read_text().strip()
        await gitrepo.add_worktree(Path(epic.repo), work, start, self._branch(epic, t))
        return work, start

    def _branch(self, epic: EpicRecord, t: TaskRecord) -> str:
        return f"{epic.branch}--{t.task_id}-{t.attempts}"

    async def _try(self, epic: EpicRecord, spec: EpicSpec, t: TaskRecord) -> None:
        verdict = t.verdict or {}
        if verdict.get("attempt") == t.attempts and verdict.get("gate") == Gate.PASS.value:
            return  # reaped before a crash: only the ratchet is left
        task = spec.task(t.task_id)
        try:
            await self._reap(epic, spec, task, t)
        except (InvalidRequest, Conflict) as err:  # a worker or judge the submit path refused
            now = (await self.store.epic_tasks(epic.id))[t.position]
            why = f"a job of the try was refused: {err}"
            await self._failed(task, now, {"attempt": t.attempts, "job": now.job_id, "why": why})

    async def _reap(self, epic: EpicRecord, spec: EpicSpec, task: TaskSpec, t: TaskRecord) -> None:
        """Ignite (once) and reap one try: the worker, its checks, the council, the gate."""
        work, start = await self._worktree(epic, t)
        if t.job_id is None:
            job = await self.submit(
                epic, task.role, worker_prompt(epic, task, t.attempts, work), work, t
            )
            t = t.with_(job_id=job.id, updated_at=self.clock())
            await self.store.save_task(t, expect=TaskState.RUNNING)
        assert t.job_id is not None
        job = await self._wait(epic.id, t.job_id)
        record: dict[str, Any] = {"attempt": t.attempts, "job": t.job_id}
        if job.state is not JobState.SUCCEEDED:
            why = f"the worker job {job.id} ended {job.state.value}"
            if job.last_error:
                why += f": {job.last_error}"
            return await self._failed(task, t, {**record, "why": why})
        checks = await gitrepo.run_checks(work, task.checks, CHECK_TIMEOUT_S)
        record["checks"] = [
            {"command": c.command, "exit_code": c.exit_code, "output": self.redact.text(c.output)}
            for c in checks
        ]
        bad = next((c for c in checks if not c.passed), None)
        if bad is not None:
            why = f"check `{bad.command}` exited {bad.exit_code}"
            return await self._failed(task, t, {**record, "why": why})
        t, verdicts = await self._council(epic, spec, task, t, await gitrepo.patch_of(work, start))
        consensus = rules.council(verdicts)
        outcome = rules.gate(True, consensus)
        record.update(
            council=consensus.value, judges=[v.to_data() for v in verdicts], gate=outcome.value
        )
        if outcome is Gate.FAIL:
            return await self._failed(task, t, {**record, "why": f"the council says {consensus}"})
        state = TaskState.ESCALATED if outcome is Gate.ESCALATE else TaskState.RUNNING
        if outcome is Gate.ESCALATE:
            subject = (
                f"epic {epic.id} task {t.task_id} try {t.attempts}: commit despite the council's "
                "disagreement"
            )
            record["approval"] = await self.escalations.ask_human(
                epic, t, "council_disagree", subject
            )
            record["why"] = (
                f"the judges disagree across vendors: approval {record['approval']} decides "
                "(approved: Corral commits the work; denied: the task is struck)"
            )
        await self.store.save_task(
            t.with_(state=state, verdict=record, updated_at=self.clock()),
            expect=TaskState.RUNNING,
        )

    async def _failed(self, task: TaskSpec, t: TaskRecord, record: dict[str, Any]) -> None:
        after = rules.after_failure(
            attempts=t.attempts, failures=t.failures, max_attempts=task.max_attempts
        )
        record.update(gate=Gate.FAIL.value, next=after.reason)
        log.info("epic %s: task %s try %d failed: %s", t.epic_id, t.task_id, t.attempts, record)
        state = after.state
        if state is TaskState.STRUCK:  # its tries are spent: its escalation steps, if any
            state = exhausted(task, record)
        await self.store.save_task(
            t.with_(state=state, failures=after.failures, verdict=record, updated_at=self.clock()),
            expect=TaskState.RUNNING,
        )

    async def submit(
        self, epic: EpicRecord, role: str, prompt: str, cwd: Path, t: TaskRecord, suffix: str = ""
    ) -> Job:
        """One fresh agent job (never a resumed session) through the normal submit path; its
        key names the try and `suffix` the job (a judge, the decomposer) beside its worker."""
        key = f"epic:{epic.id}:{t.task_id}:{t.attempts}" + (f":{suffix}" if suffix else "")
        spec = JobSpec(
            prompt=prompt,
            role=role,
            cwd=str(cwd),
            tenant=epic.tenant,
            key=key,
            options=JobOptions(epic=self._marker(epic, t), submitted_by=f"epic:{epic.id}"),
        )
        result = await self.subs.submit(spec)
        self.wake("submitted")
        return result.job

    async def _wait(self, epic_id: str, job_id: str) -> Job:
        """The job once it ended; _Cancelled when the epic is asked to stop meanwhile."""
        while True:
            job = await self.store.get_job(job_id)
            if job.state.terminal:
                return job
            if (await self.store.get_epic(epic_id)).cancel_requested is not None:
                raise _Cancelled
            await anyio.sleep(self.poll_s)

    async def _council(
        self, epic: EpicRecord, spec: EpicSpec, task: TaskSpec, t: TaskRecord, patch: bytes
    ) -> tuple[TaskRecord, list[JudgeVerdict]]:
        """The judges' verdicts on the try's diff (none when the council has no judges)."""
        folder = epic_root(self.config, epic.id) / "judges" / f"{t.task_id}-{t.attempts}"
        dirs = [folder / f"judge-{n + 1}" for n in range(spec.council.judges)]
        if not t.judges and dirs:
            ids = []
            for n, d in enumerate(dirs):
                d.mkdir(parents=True, exist_ok=True)
                (d / "task.md").write_text(task_brief(task))
                (d / "diff.patch").write_bytes(patch)
                role = spec.council.role_of(n)
                prompt = judge_prompt(task, t.attempts, d)
                job = await self.submit(epic, role, prompt, d, t, suffix=f"judge{n + 1}")
                ids.append(job.id)
            t = t.with_(judges=tuple(ids), updated_at=self.clock())
            await self.store.save_task(t, expect=TaskState.RUNNING)
        verdicts = []
        for d, job_id in zip(dirs, t.judges, strict=True):
            job = await self._wait(epic.id, job_id)
            verdicts.append(verdict_of(d / VERDICT_FILE, job))
        return t, verdicts

    # -- ratchet, cancel, end -------------------------------------------------------------------

    async def _lead(self, epic: EpicRecord) -> Path:
        """The lead's worktree on the epic branch (Corral's own, never a worker's)."""
        lead = epic_root(self.config, epic.id) / "lead"
        await gitrepo.add_worktree(Path(epic.repo), lead, epic.branch)
        return lead

    async def _drop_lead(self, epic: EpicRecord) -> None:
        lead = epic_root(self.config, epic.id) / "lead"
        if (lead / ".git").exists():
            await gitrepo.remove_worktree(Path(epic.repo), lead)

    async def _ratchet(self, epic: EpicRecord, spec: EpicSpec) -> str:
        """Commit every passing try of the wave onto the epic branch in task order; the branch's
        head after."""
        lead = await self._lead(epic)
        for t in await self.store.epic_tasks(epic.id):
            v = t.verdict or {}
            passed = v.get("gate") == Gate.PASS.value and v.get("attempt") == t.attempts
            if not (t.state is TaskState.RUNNING and passed):
                continue
            await self._commit(epic, spec, lead, t)
        return await gitrepo.text(lead, "rev-parse", "HEAD")

    async def commit_try(self, epic: EpicRecord, spec: EpicSpec, t: TaskRecord) -> None:
        """Commit an escalated try a human approved (as `_commit`)."""
        await self._commit(epic, spec, await self._lead(epic), t)

    async def _commit(self, epic: EpicRecord, spec: EpicSpec, lead: Path, t: TaskRecord) -> None:
        """Commit one try's work as the lead, then the task PASSED (a try that does not apply
        fails instead)."""
        v = t.verdict or {}
        task = spec.task(t.task_id)
        work, start = await self._worktree(epic, t)
        title = task.prompt.strip().splitlines()[0][:72]
        message = (
            f"{task.id}: {title}\n\nEpic {epic.name} ({epic.id}), wave {epic.wave}, try "
            f"{t.attempts}, worker job {t.job_id}; checks passed, council {v.get('council')}."
        )
        try:
            patch = await gitrepo.patch_of(work, start)
            sha = await gitrepo.commit_patch(lead, patch, message, self._marker(epic, t))
        except gitrepo.GitError as err:
            if t.state is TaskState.RUNNING:
                await self._failed(task, t, {**v, "why": f"the ratchet: {err}"})
            else:  # an approved escalation that no longer applies: struck, saying why
                await self.store.save_task(
                    t.with_(state=TaskState.STRUCK, verdict={**v, "why": f"the ratchet: {err}"},
                            updated_at=self.clock()),
                    expect=t.state,
                )  # fmt: skip
            return
        await self.store.save_task(
            t.with_(state=TaskState.PASSED, commit=sha, failures=0, updated_at=self.clock()),
            expect=t.state,
        )
        await gitrepo.remove_worktree(Path(epic.repo), work, self._branch(epic, t))

    async def _cancel(self, epic_id: str) -> None:
        """Stop the epic: its live jobs cancelled, its unsettled tasks cancelled, then ended."""
        epic = await self.store.get_epic(epic_id)
        reason = epic.cancel_requested or "cancelled"
        now = self.clock()
        tasks = await self.store.epic_tasks(epic_id)
        for t in tasks:
            decomposer = (t.verdict or {}).get("decomposer")
            for job_id in (t.job_id, *t.judges, decomposer):
                if not isinstance(job_id, str):
                    continue
                if not (await self.store.get_job(job_id)).state.terminal:
                    await self.subs.cancel(job_id, f"epic {epic_id} cancelled: {reason}")
            if not t.state.settled:
                await self.store.save_task(
                    t.with_(state=TaskState.CANCELLED, updated_at=now), expect=t.state
                )
        self.wake("wake")
        try:
            await self.store.end_epic(epic_id, EpicState.CANCELLED, reason, now)
        except StaleState:
            return
        await self._drop_lead(epic)
        await self._sweep(epic, tasks, ended=True)

    async def _fail(self, epic_id: str, reason: str) -> None:
        log.warning("epic %s failed: %s", epic_id, reason)
        with contextlib.suppress(StaleState):
            await self.store.end_epic(epic_id, EpicState.FAILED, reason, self.clock())
        with contextlib.suppress(gitrepo.GitError, OSError):  # the repository may be gone
            epic = await self.store.get_epic(epic_id)
            await self._sweep(epic, await self.store.epic_tasks(epic_id), ended=True)

    # -- worktrees ------------------------------------------------------------------------------

    async def _sweep(
        self, epic: EpicRecord, tasks: Sequence[TaskRecord], *, ended: bool = False
    ) -> None:
        """Remove the worktrees and branches of every settled task's tries (an escalated one's
        wait for its decision), or of every task's once the epic ended."""
        for t in tasks:
            if ended or (t.state.settled and t.state is not TaskState.ESCALATED):
                await self.drop_try(epic, t)

    async def drop_try(self, epic: EpicRecord, t: TaskRecord) -> None:
        """Remove the worktree and branch of each of the task's tries (each try's `.start` file
        marks one that may be left; it goes last, so a crash midway is swept again)."""
        for n in range(1, t.attempts + 1):
            try_ = t.with_(attempts=n)
            work = self.work_dir(epic, try_)
            start = start_file(work)
            if not (start.exists() or work.exists()):
                continue
            await gitrepo.remove_worktree(Path(epic.repo), work, self._branch(epic, try_))
            start.unlink(missing_ok=True)
