"""The event mapping (trace/events.py) and the drainer's cursor logic (trace/drain.py) on the
memory store, with a sink that fails on demand: what committed is published at least once, in
order, under stable ids; a failed publish moves no cursor; the overflow rule skips and counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import anyio
import pytest

from corral.domain.agents import AgentEvent
from corral.domain.models import JobEvent
from corral.domain.settings import EventsSpec, SinkSpec
from corral.store.memory import MemoryStore
from corral.trace.drain import Drainer, SinkDrainer
from corral.trace.events import (
    AGENT_SUBJECT,
    Event,
    agent_event,
    record_event,
    subject_of,
    window,
)
from corral.trace.sinks import NatsSink, SinkRefused, _Acks
from tests.contract.test_store_contract import AGING, NOW, make_job

SPEC = SinkSpec(name="fake", kind="nats", url="nats://127.0.0.1:1")


class FakeSink:
    def __init__(self) -> None:
        self.spec = SPEC
        self.published: list[Event] = []
        self.down = False
        self.connects = 0

    async def connect(self) -> None:
        self.connects += 1
        if self.down:
            raise ConnectionError("broker down")

    async def publish(self, events: Sequence[Event]) -> None:
        if self.down:
            raise ConnectionError("broker down")
        self.published.extend(events)

    async def close(self) -> None:
        pass


def test_subjects_name_the_state_or_the_governance_kind() -> None:
    assert (
        subject_of("job_events", {"to_state": "DEAD_LETTERED", "kind": "x"})
        == "corral.jobs.dead_lettered"
    )
    assert (
        subject_of("job_events", {"to_state": None, "kind": "attempt_ended"})
        == "corral.jobs.event.attempt_ended"
    )
    assert subject_of("switch_events", {"kind": "pause"}) == "corral.governance.pause"
    assert subject_of("approval_events", {}) == "corral.governance.approval"
    assert subject_of("policy_evaluations", {}) == "corral.governance.policy_evaluation"
    with pytest.raises(ValueError):
        record_event("jobs", {"seq": 1})


def test_a_record_keeps_its_id_and_its_json_columns_as_values() -> None:
    e = record_event(
        "job_events",
        {
            "seq": 7,
            "job_id": "j",
            "kind": "submitted",
            "to_state": "QUEUED",
            "data": '{"priority": 2}',
        },
    )
    assert e.event_id == "job_events:7"
    assert e.body["data"] == {"priority": 2}
    assert b'"event_id":"job_events:7"' in e.payload()


def test_an_agent_event_keeps_its_own_id_and_names_the_intent() -> None:
    ev = AgentEvent(
        event_id="ae1",
        job_id="j1",
        attempt=2,
        at=NOW,
        role="r",
        worker="codex",
        tenant="t",
        tokens_in=5,
        retry_count=1,
    )
    e = agent_event(ev)
    assert (e.event_id, e.subject) == ("ae1", AGENT_SUBJECT)
    assert e.body["intent_id"] == "j1" and e.body["retry_count"] == 1


def test_the_overflow_rule_skips_to_the_newest_rows_and_counts_the_rest() -> None:
    assert window(10, 50, 100).skipped == 0
    w = window(10, 250, 100)
    assert (w.after, w.skipped) == (150, 140)


async def _store_with(n: int) -> MemoryStore:
    store = MemoryStore()
    for _ in range(n):
        await store.submit(make_job(), now=NOW, aging_s=AGING)
    return store


def _drainer(store: MemoryStore, sink: FakeSink, **spec: int) -> SinkDrainer:
    events = EventsSpec(
        sinks=(SPEC,), max_backlog=spec.get("max_backlog", 1000), batch=spec.get("batch", 100)
    )
    return SinkDrainer(store, sink, events, holder="e1", clock=lambda: NOW)


def test_rows_are_published_in_order_and_the_cursor_moves_after() -> None:
    async def main() -> None:
        store, sink = await _store_with(3), FakeSink()
        d = _drainer(store, sink)
        assert await d.round() == 3
        assert [e.event_id for e in sink.published] == [f"job_events:{i}" for i in (1, 2, 3)]
        assert await d.round() == 0  # nothing new: nothing published again
        job = next(c for c in await store.event_cursors() if c.source == "job_events")
        assert job.last_id == 3

    asyncio.run(main())


def test_a_sink_is_reached_before_the_first_round_and_a_down_one_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The drainer connects its sink as it starts (the engine starts it beside the core), so
    the first events do not wait for the broker; a broker that is down is logged, and the
    rounds publish once it is back."""

    async def main() -> None:
        store, sink = await _store_with(2), FakeSink()
        sink.down = True
        d = _drainer(store, sink)
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.run)
            await wait_until(lambda: d.failures >= 1)
            assert sink.connects == 1 and sink.published == []
            sink.down = False
            await wait_until(lambda: len(sink.published) == 2)
            tg.cancel_scope.cancel()
        assert caplog.text.count("cannot reach nats") == 1

    with caplog.at_level("WARNING"):
        asyncio.run(main())


async def wait_until(done: Callable[[], bool], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not done():
            await anyio.sleep(0.01)


class CountingStore(MemoryStore):
    """The memory store, counting the outbox reads that found rows."""

    reads = 0

    async def outbox_rows(self, source: str, *, after: int, limit: int) -> list[dict[str, Any]]:
        rows = await super().outbox_rows(source, after=after, limit=limit)
        self.reads += bool(rows)
        return list(rows)


def test_two_sinks_share_each_batch_read_and_each_takes_every_row_once() -> None:
    """The sinks of an engine drain in step: a batch one read is the other's too (one read, one
    set of events), and neither takes a batch twice, so later rows reach both."""

    async def main() -> None:
        store = CountingStore()
        for _ in range(3):
            await store.submit(make_job(), now=NOW, aging_s=AGING)
        spec = EventsSpec(sinks=(SPEC, SinkSpec(name="other", kind="redis", url="redis://x")))
        sinks = iter([FakeSink(), FakeSink()])
        drainer = Drainer(
            store, spec, holder="e1", clock=lambda: NOW, sink_factory=lambda _: next(sinks)
        )
        a, b = drainer.sinks
        b.sink.spec = spec.sinks[1]
        assert await a.round() == 3 and await b.round() == 3
        assert store.reads == 1
        assert a.sink.published == b.sink.published  # type: ignore[attr-defined]
        assert a.sink.published[0] is b.sink.published[0]  # type: ignore[attr-defined]
        assert await a.round() == 0 and await b.round() == 0  # nothing new, nothing again
        await store.submit(make_job(), now=NOW, aging_s=AGING)
        assert await b.round() == 1 and await a.round() == 1
        assert store.reads == 2
        ids = ["job_events:1", "job_events:2", "job_events:3", "job_events:4"]
        for d in (a, b):
            assert [e.event_id for e in d.sink.published] == ids  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_failed_publish_moves_no_cursor_and_the_rows_go_out_later() -> None:
    async def main() -> None:
        store, sink = await _store_with(2), FakeSink()
        d = _drainer(store, sink)
        sink.down = True
        with pytest.raises(ConnectionError):
            await d.round()
        assert all(c.last_id == 0 for c in await store.event_cursors())
        sink.down = False
        assert await d.round() == 2
        assert [e.event_id for e in sink.published] == ["job_events:1", "job_events:2"]

    asyncio.run(main())


def test_past_the_backlog_bound_the_cursor_skips_ahead_and_counts() -> None:
    async def main() -> None:
        store, sink = await _store_with(10), FakeSink()
        d = _drainer(store, sink, max_backlog=4, batch=4)
        await d.round()
        assert [e.event_id for e in sink.published] == [f"job_events:{i}" for i in (7, 8, 9, 10)]
        job = next(c for c in await store.event_cursors() if c.source == "job_events")
        assert (job.last_id, job.skipped) == (10, 6)
        snap = await _snapshot(store, d)
        assert snap["skipped"] == 6 and snap["backlog"] == 0

    asyncio.run(main())


async def _snapshot(store: MemoryStore, d: SinkDrainer) -> dict[str, object]:
    drainer = Drainer(store, d.events, holder="e1", sink_factory=lambda _: d.sink)
    drainer.sinks = [d]
    [snap] = await drainer.snapshot()
    return snap


def test_an_attempts_agent_event_goes_out_just_before_its_end() -> None:
    async def main() -> None:
        store, sink = await _store_with(1), FakeSink()
        [row] = await store.outbox_rows("job_events", after=0, limit=1)
        job_id = str(row["job_id"])
        await store.record_agent_event(
            AgentEvent(
                event_id="ae1",
                job_id=job_id,
                attempt=1,
                at=NOW,
                role="default",
                worker="codex",
                tenant="default",
            )
        )
        await store.append_events(
            [JobEvent(job_id=job_id, at=NOW, kind="attempt_ended", attempt=1, message="exit 0")]
        )
        await _drainer(store, sink).round()
        assert [e.event_id for e in sink.published] == ["job_events:1", "ae1", "job_events:2"]

    asyncio.run(main())


def test_another_engines_lease_keeps_this_one_idle() -> None:
    async def main() -> None:
        store, sink = await _store_with(2), FakeSink()
        assert await store.claim_cursors(
            "fake", ("job_events",), holder="other", now=NOW, lease_s=60
        )
        assert await _drainer(store, sink).round() == 0
        assert sink.published == []

    asyncio.run(main())


def test_a_jetstream_batch_is_published_once_every_message_is_acknowledged() -> None:
    """Each message's answer is counted once; one refusal (an error, or no stream listening)
    fails the batch, which the drainer then publishes again."""
    acks = _Acks(3)
    acks.answer(0, b'{"stream":"CORRAL","seq":1}', None)
    acks.answer(0, b'{"stream":"CORRAL","seq":1}', None)  # twice: still one of three
    acks.answer(7, b"{}", None)  # not of this batch
    assert not acks.done.is_set()
    acks.answer(2, b'{"stream":"CORRAL","seq":3,"duplicate":true}', None)  # dropped: fine
    acks.answer(1, b'{"stream":"CORRAL","seq":2}', None)
    assert acks.done.is_set() and acks.error is None

    refused = _Acks(2)
    refused.answer(
        0, b'{"error":{"code":503,"description":"expected stream does not match"}}', None
    )
    refused.answer(1, b"", "503")
    assert refused.done.is_set() and "expected stream does not match" in str(refused.error)
    assert _Acks(0).done.is_set()

    for answer in (b"not json", b'{"seq":4}', b"[]"):  # anything but a stored message's answer
        odd = _Acks(1)
        odd.answer(0, answer, None)
        assert odd.done.is_set() and odd.error is not None, answer


def _hpub(frames: bytes) -> list[tuple[str, str, dict[str, str], bytes]]:
    """NATS `HPUB` commands back into (subject, reply, headers, payload)."""
    out = []
    while frames:
        line, _, frames = frames.partition(b"\r\n")
        op, subject, reply, head_len, total = line.split(b" ")
        assert op == b"HPUB"
        body, frames = frames[: int(total)], frames[int(total) :]
        assert frames[:2] == b"\r\n"
        frames = frames[2:]
        head, payload = body[: int(head_len)], body[int(head_len) :]
        lines = head.decode().split("\r\n")
        assert lines[0] == "NATS/1.0" and lines[-2:] == ["", ""]
        headers = dict(h.split(": ", 1) for h in lines[1:-2])
        out.append((subject.decode(), reply.decode(), headers, payload))
    return out


def test_a_jetstream_batch_is_framed_with_each_events_id_reply_and_stream() -> None:
    """The batch goes out as one write of HPUB commands: each event on its subject, its reply
    subject naming the batch and the message, its id and the stream in headers that stay one
    line each, its body the event's JSON (keys sorted; what JSON cannot hold, as text)."""
    sink = NatsSink(SinkSpec(name="js", kind="nats", url="nats://127.0.0.1:1", stream="CORRAL"))
    sink._inbox = "_INBOX.abc"
    events = [
        record_event("job_events", {"seq": 1, "job_id": "j", "kind": "x", "to_state": "QUEUED"}),
        Event(event_id="odd\r\nid", subject="mp.agent.events", body={"b": Decimal("1.5"), "a": 1}),
    ]
    sent = _hpub(sink._frames(events, 4, max_payload=1 << 20))
    assert [(s, r) for s, r, _, _ in sent] == [
        ("corral.jobs.queued", "_INBOX.abc.4.0"),
        ("mp.agent.events", "_INBOX.abc.4.1"),
    ]
    assert [h for _, _, h, _ in sent] == [
        {"Nats-Expected-Stream": "CORRAL", "Nats-Msg-Id": "job_events:1"},
        {"Nats-Expected-Stream": "CORRAL", "Nats-Msg-Id": "odd  id"},
    ]
    assert json.loads(sent[0][3])["event_id"] == "job_events:1"
    assert sent[1][3] == b'{"a":1,"b":"1.5"}'
    with pytest.raises(SinkRefused, match="max_payload"):
        sink._frames(events, 5, max_payload=64)
