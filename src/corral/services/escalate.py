"""Escalate, for a task whose tries are spent (docs/how-to/epics.md): its `on_exhausted` steps,
in order, between waves — re-decomposed (an agent job proposes smaller tasks in a file,
validated by corral.waves.decompose, that replace it) or handed to a human (an approval:
approved, the last try's work is committed as it is; denied, struck); a step that fails falls
to the next, and after the last the task is struck.

Everything is recorded on the task's verdict before it is acted on (the step, its job or
approval), so an engine that crashes resumes a step without running anything twice: the
decomposer's job id is saved once submitted (its idempotency key coalesces a resubmission),
and its proposal is read again from its file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from corral.config import Config
from corral.core.ports import Store
from corral.domain.epics import EpicRecord, TaskRecord, TaskState
from corral.domain.errors import Conflict, InvalidRequest
from corral.domain.governance import Approval, ApprovalState, approval_digest
from corral.domain.ids import new_id
from corral.domain.models import Job
from corral.domain.states import JobState
from corral.services.waveparts import decompose_prompt, epic_root, start_file, task_brief
from corral.waves.decompose import PROPOSAL_FILE, ProposalError, replan
from corral.waves.epic import DECOMPOSE, HUMAN, EpicSpec, TaskSpec
from corral.workers import gitrepo
from corral.workers.agentfiles import TooLarge, read_agent_json


class WaveRunner(Protocol):
    """What the escalation steps use of the wave runner (services/waves.py)."""

    store: Store
    config: Config
    clock: Callable[[], float]

    def work_dir(self, epic: EpicRecord, t: TaskRecord) -> Path: ...

    async def submit(
        self, epic: EpicRecord, role: str, prompt: str, cwd: Path, t: TaskRecord, suffix: str = ""
    ) -> Job: ...

    async def commit_try(self, epic: EpicRecord, spec: EpicSpec, t: TaskRecord) -> None: ...

    async def drop_try(self, epic: EpicRecord, t: TaskRecord) -> None: ...


MAX_PROPOSAL_BYTES = 256 * 1024


def exhausted(task: TaskSpec, record: dict[str, Any]) -> TaskState:
    """A failed try whose task's tries are spent: ESCALATED to its first step (written on
    `record`), or STRUCK when it has none."""
    return _step_to(record, task.on_exhausted)


def _step_to(record: dict[str, Any], steps: Sequence[str]) -> TaskState:
    """ESCALATED to the first of `steps`, the rest kept for later (written on `record`), or
    STRUCK when there is none."""
    if not steps:
        return TaskState.STRUCK
    record["escalation"] = steps[0]
    record["steps"] = list(steps[1:])
    return TaskState.ESCALATED


def _proposal(path: Path) -> object:
    """The decomposer's file as JSON (an agent wrote it: workers/agentfiles.py)."""
    try:
        return read_agent_json(path, MAX_PROPOSAL_BYTES)
    except TooLarge as err:
        raise ProposalError(str(err)) from None
    except (OSError, ValueError) as err:
        raise ProposalError(f"no valid {PROPOSAL_FILE}: {err}") from None


class Escalations:
    """The between-waves steps of the runner's escalated tasks."""

    def __init__(self, runner: WaveRunner) -> None:
        self.runner = runner
        self.store = runner.store

    async def step(self, epic: EpicRecord, spec: EpicSpec, tasks: list[TaskRecord]) -> bool:
        """Move every escalated task's step on as far as it can now; True when the epic's
        tasks or plan changed (read them again)."""
        changed = False
        for t in tasks:
            v = t.verdict or {}
            if t.state is not TaskState.ESCALATED:
                continue
            if v.get("escalation") == DECOMPOSE:
                changed |= await self._decompose(epic, spec, t)
            elif v.get("escalation") == HUMAN and "approval" not in v:
                await self._hand_to_human(epic, t)
                changed = True
        return changed

    def folder(self, epic: EpicRecord, t: TaskRecord) -> Path:
        root = epic_root(self.runner.config, epic.id)
        return root / "decompose" / f"{t.task_id}-{t.attempts}"

    async def _decompose(self, epic: EpicRecord, spec: EpicSpec, t: TaskRecord) -> bool:
        v = t.verdict or {}
        folder = self.folder(epic, t)
        job_id = v.get("decomposer")
        if not isinstance(job_id, str):
            try:
                await self._ignite(epic, spec, t, folder)
            except (InvalidRequest, Conflict) as err:  # the submit path refused it
                await self._next_step(epic, spec, t, f"the decomposer job was refused: {err}")
            return True
        job = await self.store.get_job(job_id)
        if not job.state.terminal:
            return False
        try:
            if job.state is not JobState.SUCCEEDED:
                raise ProposalError(f"the decomposer job {job.id} ended {job.state.value}")
            data = _proposal(folder / PROPOSAL_FILE)
            plan = replan(spec, t.task_id, data, waves_left=spec.max_waves - epic.wave)
        except ProposalError as err:
            await self._next_step(epic, spec, t, f"the re-decomposition was refused: {err}")
            return True
        await self._replace(epic, spec, plan, t)
        return True

    async def _ignite(self, epic: EpicRecord, spec: EpicSpec, t: TaskRecord, folder: Path) -> None:
        """The decomposer's folder (the task, why it failed, its last diff) and its job."""
        task = spec.task(t.task_id)
        v = t.verdict or {}
        folder.mkdir(parents=True, exist_ok=True)
        work = self.runner.work_dir(epic, t)
        (folder / "task.md").write_text(
            f"{task_brief(task)}\n"
            f"Its {t.attempts} tries failed; the last: {v.get('why', 'unknown')}\n"
            f"The last try's worktree: {work}\n"
        )
        start = start_file(work)
        if (work / ".git").exists() and start.exists():
            patch = await gitrepo.patch_of(work, start.read_text().strip())
            (folder / "diff.patch").write_bytes(patch)
        role = spec.decomposer or task.role
        prompt = decompose_prompt(task, t.attempts, folder)
        job = await self.runner.submit(epic, role, prompt, folder, t, suffix="decompose")
        await self.store.save_task(
            t.with_(verdict={**v, "decomposer": job.id}, updated_at=self.runner.clock()),
            expect=TaskState.ESCALATED,
        )

    async def _replace(
        self, epic: EpicRecord, spec: EpicSpec, plan: EpicSpec, t: TaskRecord
    ) -> None:
        now = self.runner.clock()
        old = {x.id for x in spec.tasks}
        new = [x.id for x in plan.tasks if x.id not in old]
        v = {**(t.verdict or {}), "replaced_by": new}
        added = [
            TaskRecord(epic_id=epic.id, task_id=i, position=0, state=TaskState.OPEN, updated_at=now)
            for i in new
        ]
        await self.store.replan_epic(
            epic.id,
            plan.to_data(),
            replaced=t.with_(state=TaskState.DECOMPOSED, verdict=v, updated_at=now),
            added=added,
            at=now,
        )
        await self.runner.drop_try(epic, t)

    async def _next_step(self, epic: EpicRecord, spec: EpicSpec, t: TaskRecord, why: str) -> None:
        """The step failed: the next one, or the task struck."""
        v = {**(t.verdict or {}), "why": why}
        state = _step_to(v, [s for s in v.pop("steps", []) if isinstance(s, str)])
        await self.store.save_task(
            t.with_(state=state, verdict=v, updated_at=self.runner.clock()),
            expect=TaskState.ESCALATED,
        )
        if state is TaskState.STRUCK:
            await self.runner.drop_try(epic, t)

    async def _hand_to_human(self, epic: EpicRecord, t: TaskRecord) -> None:
        v = t.verdict or {}
        subject = (
            f"epic {epic.id} task {t.task_id}: its {t.attempts} tries are spent; commit try "
            f"{t.attempts}'s work as it is in {self.runner.work_dir(epic, t)}"
        )
        approval = await self.ask_human(epic, t, "tries_exhausted", subject)
        why = (
            f"{v.get('why', 'its tries are spent')}; approval {approval} decides (approved: "
            "Corral commits the last try's work as it is; denied: the task is struck)"
        )
        await self.store.save_task(
            t.with_(
                verdict={**v, "approval": approval, "why": why}, updated_at=self.runner.clock()
            ),
            expect=TaskState.ESCALATED,
        )

    async def ask_human(self, epic: EpicRecord, t: TaskRecord, reason: str, subject: str) -> str:
        """An approval for an escalated task, bound to its last try's worker job; `corral
        approvals approve|deny ID` decides it. Asked once per subject (it names the epic, the
        task and the try): an engine that died after asking and before recording the
        approval on the task finds the one it asked, in whatever state an operator left it,
        instead of leaving it orphaned beside a second one."""
        job_id, digest = t.job_id or "", approval_digest(subject)
        for asked in await self.store.approvals(job_id=job_id):
            if (asked.reason, asked.digest) == (reason, digest):
                return asked.id
        now = self.runner.clock()
        approval = Approval.asked(
            id=new_id(int(now * 1000)),
            job_id=job_id,
            subject=subject,
            reason=reason,
            now=now,
            ttl_s=self.runner.config.settings.approval_ttl_s,
        )
        await self.store.request_approval(approval)
        return approval.id

    async def decisions(
        self, epic: EpicRecord, spec: EpicSpec, tasks: list[TaskRecord]
    ) -> list[TaskRecord]:
        """Escalated tasks whose approval was decided: approved, the try's work committed;
        denied or expired, struck. The tasks as they are after."""
        decided = False
        for t in tasks:
            approval_id = (t.verdict or {}).get("approval")
            if t.state is not TaskState.ESCALATED or not isinstance(approval_id, str):
                continue
            a = await self.store.approval(approval_id)
            if a.state is ApprovalState.PENDING:
                continue
            decided = True
            if a.state is ApprovalState.APPROVED:
                await self.runner.commit_try(epic, spec, t)
                continue
            why = f"approval {a.id} {a.state.value}" + (
                f" by {a.decided_by}" if a.decided_by else ""
            )
            await self.store.save_task(
                t.with_(
                    state=TaskState.STRUCK,
                    verdict={**(t.verdict or {}), "why": why},
                    updated_at=self.runner.clock(),
                ),
                expect=TaskState.ESCALATED,
            )
        return await self.store.epic_tasks(epic.id) if decided else tasks
