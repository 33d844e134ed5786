"""The drainer: publishes what committed, after it committed, at least once
(docs/how-to/events.md).

The outbox is the append-only tables the store already writes in the same transaction as each
change (store/outbox_sql.py: read in `seq` order, which is commit order). Per sink and table a
cursor in the store (`event_cursors`, migration 0015) says how far the sink has got: a round
reads the rows past it, publishes them, and only then moves it. An engine killed between the
publish and the move publishes those rows again after its restart, under the same ids, which
the broker (JetStream) or the consumer (Redis) drops; a row is never skipped, except by the
overflow rule (trace/events.py `window`), which counts what it skips on the cursor.

Each sink drains in its own task, away from the dispatch path: a broker that is down costs
that task a timeout and then a growing pause (backoff), while dispatch goes on and the rows
wait in their tables. With several engines on one database only the engine holding the sink's
lease drains it; the others look again when the lease runs out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from corral.core.ports import EventCursor, OutboxReads
from corral.domain.settings import EventsSpec, SinkSpec
from corral.trace.events import SOURCES, Event, agent_event, ends_attempt, record_event, window

if TYPE_CHECKING:
    from corral.trace.sinks import Sink

log = logging.getLogger(__name__)
STOP_FLUSH_S = 2.0  # how long a stopping engine goes on publishing (the rest: next engine)


@dataclasses.dataclass(slots=True)
class _Batch:
    """Rows one sink read past `after` (at most `limit`), their events once built, and the
    sinks that have used them."""

    after: int
    limit: int
    rows: list[Mapping[str, Any]]
    events: list[Event] | None
    served: set[str]


class SharedBatches:
    """The last batch read from each table, for the other sinks: the sinks of an engine drain
    in step, so a batch is read and turned into events once, not once per sink (the drainer's
    rows and events cost the engine's loop, the dispatcher's too: bench/events.py).

    A batch serves each sink at most once, so a sink never takes its own read again; what it
    holds is a prefix of what a read now would give (rows commit in `seq` order and are never
    changed), so a sink served it publishes the same rows in the same order, and the rest on
    its next round."""

    def __init__(self) -> None:
        self._last: dict[str, _Batch] = {}

    def take(self, sink: str, source: str, after: int, limit: int) -> _Batch | None:
        b = self._last.get(source)
        if b is None or (b.after, b.limit) != (after, limit) or sink in b.served:
            return None
        b.served.add(sink)
        return b

    def put(self, sink: str, source: str, after: int, limit: int, rows: list[Any]) -> _Batch:
        b = _Batch(after=after, limit=limit, rows=rows, events=None, served={sink})
        if rows:
            self._last[source] = b
        return b


class SinkDrainer:
    """Drains the outbox into one sink."""

    def __init__(
        self,
        store: OutboxReads,
        sink: Sink,
        events: EventsSpec,
        *,
        holder: str,
        clock: Callable[[], float] = time.time,
        shared: SharedBatches | None = None,
    ) -> None:
        self.store, self.sink, self.events = store, sink, events
        self.holder, self.clock = holder, clock
        self.shared = shared or SharedBatches()
        self.lease_s = max(15.0, 10 * events.poll_s)
        self._lease_until = 0.0
        self._held: dict[str, EventCursor] = {}  # source → cursor, while the lease is ours
        self.published = 0  # events published by this engine (a metric's source)
        self.failures = 0  # rounds that failed in a row
        self.behind = False  # the last round left rows for the next one

    @property
    def name(self) -> str:
        return self.sink.spec.name

    async def _cursors(self) -> list[EventCursor] | None:
        """The sink's cursors while this engine holds its lease: from the store when the lease
        needs renewing (half of it gone), else as this engine last moved them (nobody else
        moves them meanwhile), so a busy drainer does not write a lease every round."""
        now = self.clock()
        if self._held and now < self._lease_until - self.lease_s / 2:
            return list(self._held.values())
        cursors = await self.store.claim_cursors(
            self.name, SOURCES, holder=self.holder, now=now, lease_s=self.lease_s
        )
        self._held = {c.source: c for c in cursors or ()}
        self._lease_until = now + self.lease_s if cursors is not None else 0.0
        return cursors

    async def round(self) -> int:
        """Publish one batch per table; the number of rows whose cursor moved (0: idle, or
        another engine holds the lease). `behind` says whether a table had a full batch."""
        cursors = await self._cursors()
        moved, self.behind = 0, False
        for cursor in cursors or ():
            n = await self._drain(cursor)
            if n < 0:  # the lease went to another engine
                return moved
            moved += n
        return moved

    async def _read(self, source: str, after: int, limit: int) -> _Batch:
        """The rows past `after`: another sink's read of them when there is one."""
        found = self.shared.take(self.name, source, after, limit)
        if found is not None:
            return found
        rows = await self.store.outbox_rows(source, after=after, limit=limit)
        return self.shared.put(self.name, source, after, limit, list(rows))

    async def _drain(self, cursor: EventCursor) -> int:
        batch = self.events.batch
        after = cursor.last_id
        read = await self._read(cursor.source, after, batch)
        rows = read.rows
        if len(rows) == batch:  # maybe far behind: apply the overflow rule
            tip = await self.store.outbox_tip(cursor.source)
            w = window(after, tip, self.events.max_backlog)
            if w.skipped:
                log.warning(
                    "events: sink %s is %d rows of %s behind (bound %d): skipping %d",
                    self.name,
                    tip - after,
                    cursor.source,
                    self.events.max_backlog,
                    w.skipped,
                )
                if not await self._advance(cursor.source, w.after, w.skipped):
                    return -1
                after = w.after
                read = await self._read(cursor.source, after, batch)
                rows = read.rows
        if not rows:
            return 0
        self.behind = self.behind or len(rows) == batch
        if read.events is None:
            read.events = await self._events(cursor.source, rows)
        await self.sink.publish(read.events)
        self.published += len(rows)
        return len(rows) if await self._advance(cursor.source, int(rows[-1]["seq"])) else -1

    async def _advance(self, source: str, last_id: int, skipped: int = 0) -> bool:
        moved = await self.store.advance_cursor(
            self.name,
            source,
            holder=self.holder,
            last_id=last_id,
            skipped=skipped,
            now=self.clock(),
        )
        held = self._held.get(source)
        if not moved:  # another engine holds the lease now: ask the store next round
            self._held, self._lease_until = {}, 0.0
        elif held is not None:
            self._held[source] = dataclasses.replace(
                held, last_id=last_id, skipped=held.skipped + skipped
            )
        return moved

    async def _events(self, source: str, rows: Sequence[Mapping[str, Any]]) -> list[Event]:
        ends = {row["seq"]: e for row in rows if (e := ends_attempt(source, row)) is not None}
        found = await self.store.outbox_agent_events([j for j, _ in ends.values()]) if ends else []
        agents = {(e.job_id, e.attempt): e for e in found}
        out: list[Event] = []
        for row in rows:
            ended = agents.get(ends[row["seq"]]) if row["seq"] in ends else None
            if ended is not None:
                out.append(agent_event(ended))
            out.append(record_event(source, row))
        return out

    async def connect(self) -> None:
        """Reach the broker before the first round (its client's modules, its connection, its
        stream or script): what the first events would otherwise wait for. A broker that does
        not answer is said once here; the rounds retry it with their backoff."""
        try:
            with anyio.fail_after(self.sink.spec.timeout_s * 2):
                await self.sink.connect()
        except Exception as err:
            log.warning(
                "events: sink %s: cannot reach %s (%s); committed records wait for it",
                self.name,
                self.sink.spec.kind,
                err or type(err).__name__,
            )
        else:
            log.info("events: sink %s connected (%s)", self.name, self.sink.spec.kind)

    async def run(self) -> None:
        """Round after round until cancelled: at once while there is more, `poll_s` apart when
        idle, and backing off (doubling up to `max_backoff_s`) while the broker or the store
        fails."""
        await self.connect()
        pause = self.events.poll_s
        while True:
            try:
                with anyio.fail_after(max(30.0, self.sink.spec.timeout_s * 4)):
                    await self.round()
            except Exception as err:  # a broker or store outage: the rows wait in their tables
                self.failures += 1
                if self.failures == 1 or self.failures % 20 == 0:
                    log.warning(
                        "events: sink %s: %s (%d failed rounds; retrying)",
                        self.name,
                        err or type(err).__name__,
                        self.failures,
                    )
                await self.sink.close()
                pause = min(self.events.max_backoff_s, pause * 2)
                await anyio.sleep(pause)
                continue
            if self.failures:
                log.info("events: sink %s is back after %d failed rounds", self.name, self.failures)
            self.failures, pause = 0, self.events.poll_s
            if not self.behind:  # caught up: let rows gather (one write per table per round)
                await anyio.sleep(self.events.poll_s)


def _make_sink(spec: SinkSpec) -> Sink:
    """trace/sinks.py's, imported at the first sink: the broker clients (nats, redis) cost an
    engine ~0.6 s of CPU to import, which only an engine that publishes somewhere pays."""
    from corral.trace.sinks import make_sink

    return make_sink(spec)


class Drainer:
    """One SinkDrainer per configured sink, each its own task."""

    def __init__(
        self,
        store: OutboxReads,
        events: EventsSpec,
        *,
        holder: str,
        clock: Callable[[], float] = time.time,
        sink_factory: Callable[[SinkSpec], Sink] = _make_sink,
    ) -> None:
        shared = SharedBatches()
        self.sinks = [
            SinkDrainer(
                store, sink_factory(spec), events, holder=holder, clock=clock, shared=shared
            )
            for spec in events.sinks
        ]

    async def snapshot(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """Each sink's state for `corral status`: what this engine published, how far behind
        the sink is (rows committed past its cursors), and how many rows the overflow rule
        skipped; `backlog` is None when the store did not answer in time."""
        by_sink: dict[str, list[EventCursor]] = {}
        tips: dict[str, int] = {}
        with anyio.move_on_after(timeout_s):
            try:
                for cursor in await self.sinks[0].store.event_cursors() if self.sinks else ():
                    by_sink.setdefault(cursor.sink, []).append(cursor)
                for source in SOURCES:
                    tips[source] = await self.sinks[0].store.outbox_tip(source)
            except Exception as err:  # a store outage: the engine's own figures still answer
                log.debug("events snapshot: %s", err)
        out = []
        for d in self.sinks:
            cursors = {c.source: c for c in by_sink.get(d.name, [])}
            known = len(tips) == len(SOURCES)
            out.append(
                {
                    "sink": d.name,
                    "kind": d.sink.spec.kind,
                    "published": d.published,
                    "failing_rounds": d.failures,
                    "backlog": sum(
                        tips[s] - (cursors[s].last_id if s in cursors else 0) for s in SOURCES
                    )
                    if known
                    else None,
                    "skipped": sum(c.skipped for c in cursors.values()),
                    "holder": next((c.holder for c in cursors.values()), None),
                }
            )
        return out

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Before a draining engine exits: publish what is left, within `timeout_s` (what is
        not out by then goes with the next engine that drains)."""
        with anyio.move_on_after(timeout_s):
            for drainer in self.sinks:
                if drainer.failures:  # its broker is away: the next engine will publish
                    continue
                with contextlib.suppress(Exception):
                    while await drainer.round():
                        pass

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                for drainer in self.sinks:
                    tg.start_soon(drainer.run)
        finally:
            with anyio.CancelScope(shield=True):  # a clean stop: what committed goes out now
                await self.flush(STOP_FLUSH_S)
            for drainer in self.sinks:
                await drainer.sink.close()
