"""The knowledge flywheel's store contract (the KnowledgeStore port, core/ports.py; migration
0023), on the memory, SQLite and PostgreSQL stores: learnings scoped by tenant and role, one per
content; full-text search (FTS5, tsvector) of any of a query's words; score changes guarded
against a lost update and written with their history, which the SQL stores refuse to change;
citations, rewards and the A/B arms' statistics."""

from __future__ import annotations

import psycopg
import pytest

from corral.core.ports import Store
from corral.domain.errors import InvalidRequest, NotFound, StaleState, StoreError
from corral.domain.knowledge import (
    Arm,
    Citation,
    KnowledgeRun,
    Learning,
    LearningChange,
    LearningKind,
    LearningStatus,
    LearningUpdate,
    Maturity,
    Provenance,
    Tier,
)
from corral.store.sql import SqlStore
from tests.contract.test_store_contract import NOW, UseStore


def make(
    id: str,
    title: str,
    body: str,
    *,
    tenant: str = "default",
    role: str = "coder",
    status: LearningStatus = LearningStatus.ACTIVE,
    at: float = NOW,
) -> Learning:
    return Learning(
        id=id,
        tenant=tenant,
        role=role,
        kind=LearningKind.SOLUTION,
        title=title,
        body=body,
        digest=f"{title}|{body}",
        score=0.9,
        tier=Tier.GOLD,
        confidence=0.95,
        utility=0.5,
        maturity=Maturity.PROVISIONAL,
        status=status,
        provenance=Provenance(job_id="job-1", attempt=1, commit="abc123"),
        created_at=at,
        updated_at=at,
    )


def created(x: Learning) -> LearningChange:
    return LearningChange(learning_id=x.id, at=x.created_at, action="created", actor="test")


async def add(store: Store, *items: Learning) -> None:
    for x in items:
        assert await store.add_learning(x, created(x))


def test_learnings_are_scoped_and_one_per_content(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        a = make("lrn-aaaa-0001", "Pin the seed", "Use `random.seed(0)` in tests/conftest.py")
        b = make(
            "lrn-bbbb-0002", "Docker cache", "Docker layers are cached", role="ops", at=NOW + 1
        )
        c = make("lrn-cccc-0003", "Pin the seed", a.body, tenant="acme", at=NOW + 2)
        await add(store, a, b, c)
        # the same content in the same tenant and role: refused, nothing written
        assert not await store.add_learning(a.with_(id="lrn-dddd-0004"), created(a))
        assert await store.get_learning("lrn-aaaa-0001") == a
        assert (await store.get_learning("aaaa-0001")).id == a.id  # a unique prefix/suffix
        with pytest.raises(NotFound):
            await store.get_learning("lrn-zzzz")
        with pytest.raises(InvalidRequest):
            await store.get_learning("lrn-")  # names all three
        assert [x.id for x in await store.list_learnings()] == [c.id, b.id, a.id]
        assert [x.id for x in await store.list_learnings(tenant="default")] == [b.id, a.id]
        assert [x.id for x in await store.list_learnings(role="coder")] == [c.id, a.id]
        assert [x.id for x in await store.list_learnings(limit=1)] == [c.id]
        # what a short id names, within a scope: a prefix or a suffix of 4+, else the whole id
        assert [x.id for x in await store.list_learnings(ref="lrn-")] == [c.id, b.id, a.id]
        assert [x.id for x in await store.list_learnings(ref="-0002")] == [b.id]
        assert [x.id for x in await store.list_learnings(ref="0003", tenant="default")] == []
        assert [x.id for x in await store.list_learnings(ref="lrn")] == []  # too short
        assert [x.id for x in await store.list_learnings(ref=a.id)] == [a.id]
        assert [x.id for x in await store.list_learnings(ref="%aaa")] == []  # no wildcards
        history = await store.learning_history(a.id)
        assert [(h.action, h.actor) for h in history] == [("created", "test")]
        assert await store.learning_counts() == {("coder", "active"): 2, ("ops", "active"): 1}
        assert await store.learning_counts(tenant="acme") == {("coder", "active"): 1}

    use_store(body)


def test_full_text_search_finds_any_word_within_scope(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        a = make("l1", "Flaky pytest run", "Run pytest with -p no:randomly to see the order")
        b = make("l2", "Docker cache", "Docker layers are cached between builds of the image")
        c = make("l3", "Pytest and docker", "pytest inside docker needs the socket mounted")
        d = make("l4", "Pending pytest", "pytest pending a human", status=LearningStatus.PENDING)
        e = make("l5", "Other role pytest", "pytest for ops", role="ops")
        await add(store, a, b, c, d, e)
        found = await store.search_learnings("pytest docker", tenant="default", role="coder")
        assert {x.id for x in found} == {"l1", "l2", "l3"}
        assert found[0].id == "l3"  # holds both words: the best match
        only = await store.search_learnings("randomly", tenant="default", role="coder")
        assert [x.id for x in only] == ["l1"]
        assert await store.search_learnings("kubernetes", tenant="default", role="coder") == []
        pending = await store.search_learnings(
            "pytest", role="coder", status=LearningStatus.PENDING
        )
        assert [x.id for x in pending] == ["l4"]
        # the query language of neither database is reachable from a query
        odd = await store.search_learnings("docker\" * NEAR( -- '; |&!:", role="coder")
        assert {x.id for x in odd} == {"l2", "l3"}
        # no words: the newest
        assert [x.id for x in await store.search_learnings("  ", role="coder", limit=2)] == [
            "l3",
            "l2",
        ]
        # by kind and tier, with or without words
        failure = make("l6", "Pytest kept failing", "pytest failed").with_(
            kind=LearningKind.FAILURE, tier=Tier.SILVER, digest="f"
        )
        await add(store, failure)
        for kind, tier, want in (
            (LearningKind.FAILURE, None, ["l6"]),
            (None, Tier.SILVER, ["l6"]),
            (LearningKind.SOLUTION, Tier.SILVER, []),
        ):
            assert [
                x.id for x in await store.search_learnings("pytest", kind=kind, tier=tier)
            ] == want
            assert [x.id for x in await store.list_learnings(kind=kind, tier=tier)] == want

    use_store(body)


def test_updates_are_guarded_and_recorded(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        a = make("l1", "Pin the seed", "Use a fixed seed in the tests")
        await add(store, a)
        after = a.with_(utility=0.59, reward_count=1, helpful_count=1, updated_at=NOW + 5)
        change = LearningChange(
            learning_id="l1",
            at=NOW + 5,
            action="rewarded",
            actor="corral",
            reason="run j2 succeeded",
            job_id="j2",
            utility_before=0.5,
            utility_after=0.59,
        )
        await store.update_learnings([LearningUpdate(before=a, after=after, change=change)])
        assert await store.get_learning("l1") == after
        # a writer that read the old row loses: nothing written
        late = a.with_(status=LearningStatus.RETIRED, updated_at=NOW + 6)
        retire = LearningChange(learning_id="l1", at=NOW + 6, action="retired", actor="x")
        with pytest.raises(StaleState):
            await store.update_learnings([LearningUpdate(before=a, after=late, change=retire)])
        assert await store.get_learning("l1") == after
        history = await store.learning_history("l1")
        assert [h.action for h in history] == ["created", "rewarded"]
        assert history[1].utility_after == 0.59 and history[1].job_id == "j2"
        if isinstance(store, SqlStore):  # the history is append-only in the database itself
            refused = (StoreError, psycopg.errors.RaiseException)
            for sql in ("UPDATE learning_events SET actor = 'x'", "DELETE FROM learning_events"):
                with pytest.raises(refused, match="learning_events is append-only"):
                    async with store.driver.write() as tx:
                        await tx.execute(sql)
            if store.driver.dialect == "sqlite":  # the FTS5 index follows inserts only
                with pytest.raises(StoreError, match="never change"):
                    async with store.driver.write() as tx:
                        await tx.execute("UPDATE learnings SET body = 'other' WHERE id = 'l1'")
            assert len(await store.learning_history("l1")) == 2

    use_store(body)


def test_citations_rewards_and_arm_stats(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        a = make("l1", "Pin the seed", "Use a fixed seed in the tests")
        await add(store, a)
        run = KnowledgeRun(
            job_id="j1",
            attempt=1,
            tenant="default",
            role="coder",
            arm=Arm.WITH,
            reason="injected",
            injected=1,
            started_at=NOW,
        )
        cite = Citation(learning_id="l1", job_id="j1", attempt=1, at=NOW, rank=1, score=1.2)
        await store.record_injection(run, [cite])
        await store.record_injection(run, [cite])  # again (a resent dispatch): once
        assert await store.citations(job_id="j1") == [cite]
        assert (await store.get_learning("l1")).citations == 1
        for job, arm in (("j2", Arm.WITHOUT), ("j3", Arm.WITHOUT)):
            await store.record_injection(
                KnowledgeRun(
                    job_id=job,
                    attempt=1,
                    tenant="default",
                    role="coder",
                    arm=arm,
                    reason="control",
                    injected=0,
                    started_at=NOW,
                ),
                [],
            )
        assert await store.knowledge_stats() == []  # nothing ended yet
        a1 = await store.get_learning("l1")
        after = a1.with_(utility=0.59, reward_count=1, updated_at=NOW + 9)
        change = LearningChange(learning_id="l1", at=NOW + 9, action="rewarded", actor="corral")
        stale = LearningUpdate(before=a1.with_(updated_at=NOW - 1), after=after, change=change)
        with pytest.raises(StaleState):
            await store.settle_run("j1", succeeded=True, tool_calls=4, reward=0.8, updates=[stale])
        assert (await store.citations(job_id="j1"))[0].reward is None  # all or nothing
        good = LearningUpdate(before=a1, after=after, change=change)
        await store.settle_run("j1", succeeded=True, tool_calls=4, reward=0.8, updates=[good])
        await store.settle_run("j2", succeeded=False, tool_calls=9, reward=None, updates=[])
        await store.settle_run("j3", succeeded=True, tool_calls=5, reward=None, updates=[])
        assert [c.reward for c in await store.citations(learning_id="l1")] == [0.8]
        assert (await store.get_learning("l1")).utility == 0.59
        stats = {s.arm: s for s in await store.knowledge_stats(role="coder")}
        assert (stats[Arm.WITH].runs, stats[Arm.WITH].succeeded, stats[Arm.WITH].tool_calls) == (
            1,
            1,
            4,
        )
        without = stats[Arm.WITHOUT]
        assert (without.runs, without.succeeded, without.tool_calls) == (2, 1, 14)
        assert without.success_rate == 0.5 and without.tool_calls_per_run == 7.0
        assert await store.knowledge_stats(tenant="acme") == []

    use_store(body)


def test_runs_marked_to_settle_until_settled(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.settle_due(NOW + 100, 10) == []
        await store.mark_settle_due([], NOW)  # nothing: no write
        await store.mark_settle_due(["j2", "j1"], NOW)
        await store.mark_settle_due(["j3"], NOW + 5)
        assert await store.settle_due(NOW + 100, 10) == ["j1", "j2", "j3"]  # oldest first
        assert await store.settle_due(NOW + 5, 10) == ["j1", "j2"]  # marked before `before`
        assert await store.settle_due(NOW + 100, 1) == ["j1"]
        await store.mark_settle_due(["j1"], NOW + 10)  # again: marked at the new time
        assert await store.settle_due(NOW + 100, 10) == ["j2", "j3", "j1"]
        await store.settled("j2")
        await store.settled("j2")  # settled twice: nothing to clear the second time
        assert await store.settle_due(NOW + 100, 10) == ["j3", "j1"]

    use_store(body)
