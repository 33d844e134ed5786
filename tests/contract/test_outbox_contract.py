"""The store contract for the event outbox (core/ports.py OutboxReads, migration 0015): the
append-only tables read past a cursor in `seq` order, and the per-sink cursors with their lease.
Runs on the memory, SQLite and PostgreSQL stores like test_store_contract.py."""

from __future__ import annotations

from corral.core.ports import Store
from corral.domain.agents import AgentEvent
from corral.domain.governance import KillSwitch, ScopeKind
from corral.trace.events import SOURCES, record_event
from tests.contract.test_store_contract import AGING, NOW, UseStore, make_job

SINK = "nats"


async def _submit(store: Store, n: int) -> None:
    for _ in range(n):
        await store.submit(make_job(), now=NOW, aging_s=AGING)


def test_outbox_rows_come_in_seq_order_past_the_cursor(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.outbox_tip("job_events") == 0
        assert await store.outbox_rows("job_events", after=0, limit=10) == []
        await _submit(store, 3)
        rows = await store.outbox_rows("job_events", after=0, limit=10)
        assert [r["seq"] for r in rows] == [1, 2, 3]
        assert [r["kind"] for r in rows] == ["submitted"] * 3
        assert await store.outbox_tip("job_events") == 3
        assert [r["seq"] for r in await store.outbox_rows("job_events", after=1, limit=1)] == [2]
        event = record_event("job_events", rows[0])
        assert (event.event_id, event.subject) == ("job_events:1", "corral.jobs.queued")
        assert isinstance(event.body["data"], dict)  # the JSON column as a JSON value

    use_store(body)


def test_governance_records_are_in_the_outbox(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        await store.activate_kill_switch(
            KillSwitch(
                id="ks1",
                scope=ScopeKind.GLOBAL,
                target=None,
                reason="drill",
                created_at=NOW,
                created_by="ops",
            )
        )
        rows = await store.outbox_rows("switch_events", after=0, limit=10)
        assert len(rows) == 1
        event = record_event("switch_events", rows[0])
        assert event.subject == "corral.governance.kill_switch"
        assert event.event_id == "switch_events:1"

    use_store(body)


def test_cursors_start_at_zero_and_move_only_forward(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        cursors = await store.claim_cursors(SINK, SOURCES, holder="e1", now=NOW, lease_s=30)
        assert cursors is not None
        assert {c.source for c in cursors} == set(SOURCES)
        assert all(c.last_id == 0 and c.skipped == 0 and c.holder == "e1" for c in cursors)
        assert await store.advance_cursor(SINK, "job_events", holder="e1", last_id=5, now=NOW)
        assert await store.advance_cursor(
            SINK, "job_events", holder="e1", last_id=9, skipped=4, now=NOW
        )
        assert not await store.advance_cursor(SINK, "job_events", holder="e1", last_id=3, now=NOW)
        again = await store.claim_cursors(SINK, SOURCES, holder="e1", now=NOW + 1, lease_s=30)
        assert again is not None
        job = next(c for c in again if c.source == "job_events")
        assert (job.last_id, job.skipped) == (9, 4)
        listed = await store.event_cursors()
        assert [(c.sink, c.source) for c in listed] == sorted((SINK, s) for s in SOURCES)

    use_store(body)


def test_one_holder_drains_a_sink_until_its_lease_runs_out(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.claim_cursors(SINK, SOURCES, holder="e1", now=NOW, lease_s=30)
        assert (
            await store.claim_cursors(SINK, SOURCES, holder="e2", now=NOW + 10, lease_s=30) is None
        )
        assert await store.claim_cursors(
            "redis", SOURCES, holder="e2", now=NOW + 10, lease_s=30
        )  # another sink: its own lease
        taken = await store.claim_cursors(SINK, SOURCES, holder="e2", now=NOW + 31, lease_s=30)
        assert taken is not None and {c.holder for c in taken} == {"e2"}
        # the engine that lost the lease can no longer move the cursor
        assert not await store.advance_cursor(
            SINK, "job_events", holder="e1", last_id=1, now=NOW + 32
        )
        assert await store.advance_cursor(SINK, "job_events", holder="e2", last_id=1, now=NOW + 32)

    use_store(body)


def test_agent_events_of_a_batch_come_in_one_read(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        for job_id, attempt in (("j1", 1), ("j1", 2), ("j2", 1), ("j3", 1)):
            await store.record_agent_event(
                AgentEvent(
                    event_id=f"{job_id}-{attempt}",
                    job_id=job_id,
                    attempt=attempt,
                    at=NOW,
                    role="default",
                    worker="codex",
                    tenant="default",
                )
            )
        found = await store.outbox_agent_events(["j1", "j3", "j1"])
        assert [(e.job_id, e.attempt) for e in found] == [("j1", 1), ("j1", 2), ("j3", 1)]
        assert await store.outbox_agent_events([]) == []

    use_store(body)
