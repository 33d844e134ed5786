"""The knowledge flywheel in the product path (runtime/flywheel.py) over the memory store: a
run's end writes its learnings under write-on-success; dispatch injects the role's best ones
into the attempt's job (and so into the agent's appended system prompt), recording citations
and the A/B arm; the next run's end rewards them; the switch per role; a broken extractor or
store never costs a dispatch or a report."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from corral.config_models import parse, resolve
from corral.domain.agents import AgentEvent, ToolCallTrace
from corral.domain.errors import ConfigError, StoreError
from corral.domain.knowledge import Arm, LearningKind, LearningStatus, Maturity, Tier
from corral.domain.models import Attempt, Claimed, Job, Permit
from corral.domain.settings import KnowledgeSpec, RoleSpec, Settings, WorkerSpec
from corral.domain.states import AttemptState, JobState
from corral.knowledge import extract
from corral.runtime.flywheel import LOST_AFTER_S, Flywheel, control_arm, load_extractor
from corral.runtime.reporter import Reporter
from corral.schemas import published as schemas
from corral.services import knowledge
from corral.store.memory import MemoryStore
from corral.workers.agents.base import Context
from corral.workers.agents.claude import ClaudeCodeWorker
from corral.workers.agents.codex import CodexWorker
from tests.contract.test_store_contract import AGING, claim, ending, make_job

NOW = 1_800_000_000.0
FIXED = "The flaky test in tests/test_a.py was fixed by pinning `random.seed(0)` in line 3."


def settings(mode: str = "on", **spec: Any) -> Settings:
    return Settings(
        roles={"coder": RoleSpec(name="coder", worker="claude-code", knowledge=mode)},
        environments={},
        knowledge=KnowledgeSpec(**spec),
    )


def agent_job(state: JobState = JobState.SUCCEEDED, **kw: Any) -> Job:
    fields: dict[str, Any] = {
        "role": "coder",
        "worker": "claude-code",
        "state": state,
        "command": (),
        "prompt": "fix the flaky test in tests/test_a.py",
    }
    return make_job(**{**fields, **kw})


def event(
    job: Job,
    *,
    final: str | None = FIXED,
    calls: tuple[ToolCallTrace, ...] = (),
    error: str | None = None,
    attempt: int = 1,
) -> AgentEvent:
    return AgentEvent(
        event_id=f"{job.id}.{attempt}",
        job_id=job.id,
        attempt=attempt,
        at=NOW,
        role=job.role,
        worker=job.worker,
        tenant=job.tenant,
        tool_calls=calls,
        final_text=final,
        error=error,
    )


def claimed(job: Job, index: int = 1) -> Claimed:
    attempt = Attempt(
        id=f"{job.id}-a{index}",
        job_id=job.id,
        index=index,
        state=AttemptState.STARTING,
        permit_id="p",
        deadline_at=NOW + 60,
        created_at=NOW,
        dir="/tmp/none",
        engine_id="e",
    )
    permit = Permit(
        id="p",
        job_id=job.id,
        attempt_index=index,
        issued_at=NOW,
        deadline_at=NOW + 60,
        grace_s=1,
        granted={},
        breaker="closed",
        seal="s",
    )
    return Claimed(job=job, attempt=attempt, permit=permit)


def test_a_learning_from_run_one_reaches_run_two_and_moves_when_it_ends() -> None:
    async def main() -> None:
        store = MemoryStore()
        clock = [NOW]
        wheel = Flywheel(store, settings(), clock=lambda: clock[0])
        one = agent_job()
        await wheel.settle(one, [event(one)])
        [learned] = await store.list_learnings(role="coder")
        assert learned.kind is LearningKind.SOLUTION and learned.tier is Tier.GOLD
        assert learned.status is LearningStatus.ACTIVE and learned.utility == 0.5
        assert learned.provenance.job_id == one.id and learned.provenance.attempt == 1
        history = await store.learning_history(learned.id)
        assert [h.action for h in history] == ["created"] and "gold" in history[0].reason

        clock[0] += 60
        two = agent_job(JobState.RUNNING)
        c = await wheel.inject(claimed(two))
        assert c.job.options.knowledge is not None
        assert learned.title in c.job.options.knowledge and learned.id in c.job.options.knowledge
        [cite] = await store.citations(job_id=two.id)
        assert (cite.learning_id, cite.attempt, cite.rank, cite.reward) == (learned.id, 1, 1, None)
        # what the agent's CLI is started with: the role's prompt, then the learnings
        role = RoleSpec(name="coder", worker="claude-code", system_prompt="Be brief.")
        argv = ClaudeCodeWorker(
            lambda p: None, WorkerSpec(name="claude-code"), {"coder": role}, Path("/tmp")
        ).argv(c.job, ctx(role))
        appended = argv[argv.index("--append-system-prompt") + 1]
        assert appended == "Be brief.\n\n" + c.job.options.knowledge
        codex = CodexWorker(lambda p: None, WorkerSpec(name="codex"), {"coder": role}, Path("/tmp"))
        assert c.job.options.knowledge in " ".join(codex.argv(c.job, ctx(role)))

        clock[0] += 60
        await wheel.settle(two.with_(state=JobState.SUCCEEDED), [event(two, final=None)])
        after = await store.get_learning(learned.id)
        assert after.utility == pytest.approx(0.59)  # 0.7·0.5 + 0.3·0.8
        assert after.reward_count == 1 and after.citations == 1
        assert [c.reward for c in await store.citations(job_id=two.id)] == [0.8]
        assert [h.action for h in await store.learning_history(learned.id)] == [
            "created",
            "rewarded",
        ]
        # `corral knowledge show --json` with a citation and a reward: the published shape
        shown = (await knowledge.show(store, learned.id)).view(clock[0])
        jsonschema.validate(shown, schemas.json_schema("LearningShow"))
        assert [(c["job_id"], c["rank"], c["reward"]) for c in shown["cited_by"]] == [
            (two.id, 1, 0.8)
        ]
        assert shown["history"][1]["utility"] == [0.5, pytest.approx(0.59)]
        # settled once: a second settle of the same run rewards nothing again
        await wheel.settle(two.with_(state=JobState.SUCCEEDED), [event(two, final=None)])
        assert (await store.get_learning(learned.id)).reward_count == 1
        [stats] = await store.knowledge_stats(role="coder")
        assert (stats.arm, stats.runs, stats.succeeded) == (Arm.WITH, 1, 1)

    asyncio.run(main())


def ctx(role: RoleSpec) -> Context:
    return Context(
        binary="claude",
        attempt_dir=Path("/tmp/a"),
        home=Path("/tmp/h"),
        hook=["hook"],
        role=role,
        resume=None,
        session_id="s",
    )


def test_write_on_success_and_bronze_waits_for_a_human() -> None:
    async def main() -> None:
        store = MemoryStore()
        wheel = Flywheel(store, settings(), clock=lambda: NOW)
        denied = ToolCallTrace(
            tool="Bash", input={"command": "rm -rf /"}, denied=True, reason="guardrail: rm"
        )
        failed = agent_job(JobState.FAILED)
        final = "We decided to use tabs everywhere."
        await wheel.settle(failed, [event(failed, calls=(denied,), error="exit 1", final=final)])
        written = await store.list_learnings()
        # the failed run's failures only: its decision is not written
        assert len(written) == 2 and {x.kind for x in written} == {LearningKind.FAILURE}
        cancelled = agent_job(JobState.CANCELLED)
        await wheel.settle(cancelled, [event(cancelled, final="We decided to use spaces.")])
        assert len(await store.list_learnings()) == 2  # an abandoned run writes nothing
        # "turns out": a learning scored bronze, (0.7 + 0.465)/2 + 0.07 = 0.6525 (its source line
        # says "run": actionability 0.6): stored, waiting for a human
        ok = agent_job()
        await wheel.settle(ok, [event(ok, final="Turns out the cache was stale all along.")])
        [bronze] = await store.list_learnings(status=LearningStatus.PENDING)
        assert bronze.tier is Tier.BRONZE and bronze.score == pytest.approx(0.6825)
        assert bronze.kind is LearningKind.LEARNING
        # never injected while it waits
        c = await wheel.inject(claimed(agent_job(JobState.RUNNING, prompt="the cache was stale")))
        assert c.job.options.knowledge is None
        # the same content again (another run): one learning
        again = agent_job()
        await wheel.settle(again, [event(again, final="Turns out the cache was stale all along.")])
        assert len(await store.list_learnings(status=LearningStatus.PENDING)) == 1

    asyncio.run(main())


def test_the_switch_per_role_and_the_ab_arms() -> None:
    async def main() -> None:
        store = MemoryStore()
        seed = Flywheel(store, settings(), clock=lambda: NOW)
        one = agent_job()
        await seed.settle(one, [event(one)])
        off = Flywheel(store, settings("off"), clock=lambda: NOW)
        c = await off.inject(claimed(agent_job(JobState.RUNNING)))
        assert c.job.options.knowledge is None
        ab = Flywheel(store, settings("ab"), clock=lambda: NOW)
        jobs = [agent_job(JobState.RUNNING, id=f"ab-{i:02}") for i in range(16)]
        arms = {j.id: control_arm(j.id) for j in jobs}  # fixed ids: a fixed split
        assert sum(arms.values()) == 10  # 10 of these 16 in the control arm
        for j in jobs:
            c = await ab.inject(claimed(j))
            assert (c.job.options.knowledge is None) == arms[j.id]
        for j in jobs:
            await ab.settle(j.with_(state=JobState.SUCCEEDED), [event(j, final=None)])
        stats = {s.arm: s.runs for s in await store.knowledge_stats(role="coder")}
        assert stats == {
            Arm.WITH: sum(1 for v in arms.values() if not v),
            Arm.WITHOUT: sum(1 for v in arms.values() if v),
        }
        # the control arm's runs are not rewarded: only the treatment's cited the learning
        [learned] = await store.list_learnings()
        assert learned.reward_count == stats[Arm.WITH]
        # 6 rewards of 0.8, all helpful: provisional → candidate (3) → established (5)
        assert learned.maturity is Maturity.ESTABLISHED
        # `corral knowledge stats --json` with both arms filled: the published shape
        shown = await knowledge.stats(store, role="coder")
        jsonschema.validate(shown, schemas.json_schema("KnowledgeStats"))
        [row] = shown["roles"]
        assert row["with"]["runs"] == stats[Arm.WITH]
        assert row["without"]["runs"] == stats[Arm.WITHOUT]
        assert row["uplift"]["success_rate"] == 0.0  # every run of both arms succeeded

    asyncio.run(main())


def broken(trace: extract.RunTrace) -> list[Any]:
    raise RuntimeError("extractor bug")


class DownStore(MemoryStore):
    async def search_learnings(self, *a: Any, **kw: Any) -> Any:
        raise StoreError("the store is down")


def test_extractor_is_pluggable_and_failures_cost_nothing_but_learnings() -> None:
    assert load_extractor("rules") is extract.rules
    assert load_extractor("tests.unit.test_flywheel:broken") is broken
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_extractor("no.such.module:f")
    with pytest.raises(ConfigError, match="not a function"):
        load_extractor("tests.unit.test_flywheel:NOW")

    async def main() -> None:
        store = MemoryStore()
        wheel = Flywheel(store, settings(extractor="tests.unit.test_flywheel:broken"))
        job = agent_job()
        await wheel.settle(job, [event(job)])  # logged, not raised
        assert await store.list_learnings() == []
        down = Flywheel(DownStore(), settings())
        c = claimed(agent_job(JobState.RUNNING))
        assert await down.inject(c) == c  # dispatched without learnings

    asyncio.run(main())


def test_the_role_switch_reads_yaml_booleans_as_its_words() -> None:
    text = "roles: {a: {knowledge: on}, b: {knowledge: off}, c: {knowledge: ab}, d: {}}"
    roles = resolve(parse(text, "c.yaml"), "c.yaml").roles
    assert [roles[r].knowledge for r in "abcd"] == ["on", "off", "ab", "off"]
    with pytest.raises(ConfigError, match="knowledge"):
        resolve(parse("roles: {a: {knowledge: maybe}}", "c.yaml"), "c.yaml")
    with pytest.raises(ConfigError, match="extractor"):
        resolve(parse("knowledge: {extractor: 'rm -rf'}", "c.yaml"), "c.yaml")


class Dies(Exception):
    """The engine dying in the middle of a settle (nothing after it runs)."""


class FlakyStore(MemoryStore):
    """A store that fails the next `fail` rewards, as a store outage does."""

    fail = 0

    async def settle_run(self, *a: Any, **kw: Any) -> None:
        if self.fail:
            self.fail -= 1
            raise StoreError("the store is down")
        await super().settle_run(*a, **kw)


def test_a_settle_lost_to_a_crash_or_an_outage_is_done_by_the_next_look() -> None:
    async def main() -> None:
        store = FlakyStore()
        clock = [NOW]
        wheel = Flywheel(store, settings(), clock=lambda: clock[0])
        learned = agent_job()
        await wheel.settle(learned, [event(learned)])  # a learning to give the next run
        [lesson] = await store.list_learnings()

        async def ran(job: Job) -> None:
            """A run given the learning, ended, its agent event recorded; not reported yet."""
            job = (await store.submit(job, now=clock[0], aging_s=AGING)).job
            [won] = await store.start_attempts([claim(job)], now=clock[0])
            await wheel.inject(claimed(job, won.attempt.index))
            await store.finish([ending(won.attempt, JobState.SUCCEEDED)], now=clock[0])
            await store.record_agent_event(event(job, final=None))

        # the engine dies between the run's report and its settle
        one = agent_job(JobState.QUEUED)
        await ran(one)

        async def dies(job: Job, events: Any) -> None:
            raise Dies

        wheel.settle = dies  # type: ignore[method-assign]
        with pytest.raises(Dies):
            await Reporter(store, clock=lambda: clock[0], flywheel=wheel).catch_up()
        assert await store.report(one.id) is not None
        assert await store.unreported() == []  # reported: never drafted again
        assert [c.reward for c in await store.citations(job_id=one.id)] == [None]
        del wheel.settle  # the next engine's flywheel

        reporter = Reporter(store, clock=lambda: clock[0], flywheel=wheel)
        assert await reporter.settle_lost() == 0  # too fresh: maybe a settle under way
        clock[0] += LOST_AFTER_S + 1
        assert await reporter.settle_lost() == 1
        assert [c.reward for c in await store.citations(job_id=one.id)] == [0.8]
        assert (await store.get_learning(lesson.id)).reward_count == 1
        assert await store.settle_due(clock[0] + 1e9, 10) == []  # settled: the mark is gone
        assert await reporter.settle_lost() == 0

        # the store fails the reward: the mark stays, and the run is settled a minute later
        two = agent_job(JobState.QUEUED)
        await ran(two)
        store.fail = 1
        assert await reporter.catch_up() == 0
        assert [c.reward for c in await store.citations(job_id=two.id)] == [None]
        assert await store.settle_due(clock[0] + 1, 10) == [two.id]
        clock[0] += LOST_AFTER_S + 1
        assert await reporter.settle_lost() == 1
        assert [c.reward for c in await store.citations(job_id=two.id)] == [0.8]
        assert (await store.get_learning(lesson.id)).reward_count == 2  # once per run
        [stats] = await store.knowledge_stats(role="coder")
        assert (stats.arm, stats.runs, stats.succeeded) == (Arm.WITH, 2, 2)
        assert await store.settle_due(clock[0] + 1e9, 10) == []

        # a command job has nothing to settle: no mark, no write
        plain = (await store.submit(make_job(), now=clock[0], aging_s=AGING)).job
        [won] = await store.start_attempts([claim(plain)], now=clock[0])
        await store.finish([ending(won.attempt, JobState.SUCCEEDED)], now=clock[0])
        await reporter.catch_up()
        assert await store.settle_due(clock[0] + 1e9, 10) == []

    asyncio.run(main())
