"""The brokers committed records are published to (docs/how-to/events.md): NATS JetStream and
Redis Streams. A sink publishes a batch whole or raises; it reconnects on the next batch after a
failure, and every wait is bounded by the sink's `timeout_s`, so a broker that is down or slow
costs the drainer (trace/drain.py) time, never the dispatcher.

JetStream drops a second copy of an event by its `Nats-Msg-Id` header (the stream's duplicate
window, 2 minutes by default); a Redis stream entry carries the id in its `event_id` field for
the consumer to drop a second copy.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import anyio
import nats
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from corral.domain.settings import SinkSpec
from corral.trace.events import AGENT_SUBJECT, GOVERNANCE_PREFIX, JOB_PREFIX, SUBJECTS, Event

log = logging.getLogger(__name__)
MSG_ID = "Nats-Msg-Id"
EXPECTED_STREAM = "Nats-Expected-Stream"  # JetStream refuses a message its stream does not take
STATUS = "Status"
NO_RESPONDERS = "503"
_STORED = b'{"stream":'  # how JetStream's acknowledgement of a stored message begins


def _header_value(text: str) -> bytes:
    """A header value on the wire: one line (a line break would end the header early)."""
    return text.strip().replace("\r", " ").replace("\n", " ").encode()


class SinkRefused(Exception):
    """The broker answered a batch with an error: it is published again on the next round."""


class Sink(Protocol):
    """Where the drainer publishes."""

    spec: SinkSpec

    async def connect(self) -> None:
        """Reach the broker now (bounded by `spec.timeout_s`), or raise: an engine does this as
        it starts, so that its first events do not wait for it."""

    async def publish(self, events: Sequence[Event]) -> None:
        """Publish every event, in order, or raise (then none counts as published)."""

    async def close(self) -> None: ...


async def _quiet(err: Exception) -> None:
    """nats-py reports connection trouble here; the drainer logs the failure it causes."""
    log.debug("nats: %s", err)


class _Acks:
    """What JetStream answered for one batch: each message is acknowledged (or refused) on a
    reply subject of its own; `done` is set once every one of them has answered."""

    def __init__(self, n: int) -> None:
        self.waiting = set(range(n))
        self.error: str | None = None
        self.done = anyio.Event()
        if not n:
            self.done.set()

    def answer(self, index: int, data: bytes, status: str | None) -> None:
        if index not in self.waiting:
            return  # an answer twice, or one of another batch's size
        self.waiting.discard(index)
        if status == NO_RESPONDERS:
            self.error = self.error or "no stream listens on the subject (503 no responders)"
        elif not data.startswith(_STORED):  # else stored: `{"stream":…,"seq":…}`
            try:
                body = json.loads(data)
            except ValueError:
                body = None
            if not isinstance(body, dict) or "stream" not in body or "error" in body:
                why = body.get("error") if isinstance(body, dict) else None
                shown = why or data[:200].decode(errors="replace")
                self.error = self.error or f"JetStream refused a message: {shown}"
        if not self.waiting:
            self.done.set()


class NatsSink:
    """JetStream: each event on its subject, `Nats-Msg-Id` set to its id.

    A batch is published as plain messages whose reply subjects say which message of which
    batch each acknowledgement is for; the batch counts as published once JetStream has
    acknowledged every message (a refusal, or no answer within `timeout_s`: it fails whole).
    nats-py's own `publish_async` made a future, a callback, a random token and a semaphore
    turn per message, about a third of what the sinks cost the engine (bench/events.py).

    The messages are framed here and handed to nats-py's connection as one write (its
    `_send_command` and `_flush_pending`, which `publish` itself calls; nats-py is pinned to
    one minor version in pyproject.toml, and tests/acceptance/test_events.py publishes through
    a real server)."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec
        self._nc: Nats | None = None
        self._inbox = ""
        self._batches: dict[int, _Acks] = {}
        self._next = itertools.count()

    async def _connect(self) -> Nats:
        if self._nc is not None and self._nc.is_connected:
            return self._nc
        await self.close()
        with anyio.fail_after(self.spec.timeout_s):
            nc = await nats.connect(
                self.spec.url,
                name="corral-events",
                allow_reconnect=False,
                connect_timeout=max(1, math.ceil(self.spec.timeout_s)),
                error_cb=_quiet,
                # the subjects are trace/events.py's (each token cleaned) and our inbox's: a
                # check of both on every message was a fifth of what a publish cost
                skip_subject_validation=True,
            )
            self._nc = nc
            js = nc.jetstream(timeout=self.spec.timeout_s)
            try:
                await js.stream_info(self.spec.stream)
            except NotFoundError:
                await js.add_stream(name=self.spec.stream, subjects=list(SUBJECTS))
            self._inbox = nc.new_inbox()
            await nc.subscribe(f"{self._inbox}.>", cb=self._on_ack)
        return nc

    async def connect(self) -> None:
        await self._connect()

    async def _on_ack(self, msg: Msg) -> None:
        batch, _, index = msg.subject[len(self._inbox) + 1 :].partition(".")
        acks = self._batches.get(int(batch)) if batch.isdigit() else None
        if acks is not None and index.isdigit():
            status = msg.headers.get(STATUS) if msg.headers else None
            acks.answer(int(index), msg.data, status)

    async def publish(self, events: Sequence[Event]) -> None:
        nc = await self._connect()
        batch = next(self._next)
        acks = self._batches[batch] = _Acks(len(events))
        try:
            with anyio.fail_after(self.spec.timeout_s * 2):
                # the whole batch as one protocol write, then one flush: nats-py's `publish`
                # built each message's headers through a regex per key and queued a write per
                # message, about half of what a record cost the engine (bench/events.py)
                await nc._send_command(self._frames(events, batch, nc.max_payload))
                await nc._flush_pending()
                await acks.done.wait()
            if acks.error is not None:
                raise SinkRefused(acks.error)
        except BaseException:
            await self.close()
            raise
        finally:
            del self._batches[batch]

    def _frames(self, events: Sequence[Event], batch: int, max_payload: int) -> bytes:
        """The batch in NATS's wire protocol: one `HPUB <subject> <reply> <header bytes>
        <total bytes>` per event, its headers naming the stream and the event's id."""
        stream = _header_value(self.spec.stream)
        reply = f"{self._inbox}.{batch}.".encode()
        out = bytearray()
        for i, e in enumerate(events):
            payload = e.payload()
            head = b"NATS/1.0\r\n%s: %s\r\n%s: %s\r\n\r\n" % (
                EXPECTED_STREAM.encode(),
                stream,
                MSG_ID.encode(),
                _header_value(e.event_id),
            )
            if len(head) + len(payload) > max_payload:
                raise SinkRefused(
                    f"event {e.event_id} is {len(payload)} bytes, over the server's "
                    f"max_payload of {max_payload}"
                )
            out += b"HPUB %s %s%d %d %d\r\n%s%s\r\n" % (
                e.subject.encode(),
                reply,
                i,
                len(head),
                len(head) + len(payload),
                head,
                payload,
            )
        return bytes(out)

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with anyio.move_on_after(self.spec.timeout_s, shield=True):
                await nc.close()


# A batch in one command: each event appended to its stream key (KEYS[i]) with its id and body
# (ARGV[2i], ARGV[2i+1]), trimmed to about ARGV[1] entries when that is not empty. A pipeline of
# one XADD per event cost the engine a command to pack and a reply to parse per event, in
# Python (redis-py): most of what the Redis sink cost dispatch (bench/events.py). A failure
# part way leaves the events before it appended, as a pipeline does: the batch is published
# again, under the same ids.
_XADD_ALL = """
local maxlen = ARGV[1]
for i = 1, #KEYS do
  if maxlen == '' then
    redis.call('XADD', KEYS[i], '*', 'event_id', ARGV[2 * i], 'data', ARGV[2 * i + 1])
  else
    redis.call('XADD', KEYS[i], 'MAXLEN', '~', maxlen, '*',
               'event_id', ARGV[2 * i], 'data', ARGV[2 * i + 1])
  end
end
return #KEYS
"""


class RedisSink:
    """Redis Streams: each event appended to the stream named like its subject (a batch in one
    script call: one Redis server, not a cluster, whose keys may live on several nodes)."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec
        self._redis: Redis | None = None
        self._script: AsyncScript | None = None

    def _client(self) -> Redis:
        if self._redis is None:
            self._redis = Redis.from_url(
                self.spec.url,
                socket_timeout=self.spec.timeout_s,
                socket_connect_timeout=self.spec.timeout_s,
            )
        return self._redis

    async def connect(self) -> None:
        r = self._client()
        try:
            with anyio.fail_after(self.spec.timeout_s * 2):
                self._script = r.register_script(_XADD_ALL)
                await r.script_load(_XADD_ALL)  # the first batch's EVALSHA finds it
        except BaseException:
            await self.close()
            raise

    async def publish(self, events: Sequence[Event]) -> None:
        if not events:
            return
        r = self._client()
        if self._script is None:
            self._script = r.register_script(_XADD_ALL)
        maxlen = "" if self.spec.maxlen is None else str(self.spec.maxlen)
        args: list[str | bytes] = [maxlen]
        for e in events:
            args += (e.event_id.encode(), e.payload())
        try:
            with anyio.fail_after(self.spec.timeout_s * 2):
                await self._script(keys=[e.subject for e in events], args=args)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        r, self._redis, self._script = self._redis, None, None
        if r is not None:
            with anyio.move_on_after(self.spec.timeout_s, shield=True):
                await r.aclose()


def make_sink(spec: SinkSpec) -> Sink:
    if spec.kind == "nats":
        return NatsSink(spec)
    if spec.kind == "redis":
        return RedisSink(spec)
    raise ValueError(f"unknown sink kind {spec.kind!r}")


# ---- following a sink (`corral events tail`) ----------------------------------------------


def _event(subject: str, event_id: str, data: bytes) -> Event:
    try:
        body: Any = json.loads(data)
    except ValueError:
        body = {"raw": data.decode(errors="replace")}
    return Event(
        event_id=event_id, subject=subject, body=body if isinstance(body, dict) else {"value": body}
    )


async def follow(spec: SinkSpec, *, from_start: bool) -> AsyncIterator[Event]:
    """The sink's events as they arrive (from the oldest it keeps with `from_start`)."""
    source = _follow_nats if spec.kind == "nats" else _follow_redis
    async for event in source(spec, from_start=from_start):
        yield event


async def _follow_nats(spec: SinkSpec, *, from_start: bool) -> AsyncIterator[Event]:
    with anyio.fail_after(spec.timeout_s):
        nc = await nats.connect(
            spec.url,
            name="corral-events-tail",
            error_cb=_quiet,
            connect_timeout=max(1, math.ceil(spec.timeout_s)),
        )
    try:
        js = nc.jetstream(timeout=spec.timeout_s)
        policy = DeliverPolicy.ALL if from_start else DeliverPolicy.NEW
        subs = [
            await js.subscribe(
                subject, stream=spec.stream, ordered_consumer=True, deliver_policy=policy
            )
            for subject in SUBJECTS
        ]
        send, receive = anyio.create_memory_object_stream[Event](1000)

        async def pump(sub: Any) -> None:
            async for msg in sub.messages:
                headers = msg.headers or {}
                await send.send(_event(msg.subject, headers.get(MSG_ID, ""), msg.data))

        async with anyio.create_task_group() as tg, receive:
            for sub in subs:
                tg.start_soon(pump, sub)
            async for event in receive:
                yield event
    finally:
        await nc.close()


_REDIS_KEYS = (AGENT_SUBJECT, JOB_PREFIX + ".*", GOVERNANCE_PREFIX + ".*")


async def _redis_keys(r: Redis) -> set[str]:
    keys: set[str] = set()
    for pattern in _REDIS_KEYS:
        async for key in r.scan_iter(match=pattern, _type="stream"):
            keys.add(key.decode() if isinstance(key, bytes) else str(key))
    return keys


async def _follow_redis(spec: SinkSpec, *, from_start: bool) -> AsyncIterator[Event]:
    r = Redis.from_url(spec.url, socket_connect_timeout=spec.timeout_s)
    try:
        last: dict[str, str] = {}
        for key in await _redis_keys(r):
            newest: Any = [] if from_start else await r.xrevrange(key, count=1)
            last[key] = newest[0][0].decode() if newest else "0"
        while True:
            for key in await _redis_keys(r):  # a stream key made since: all of it is new
                last.setdefault(key, "0")
            if not last:
                await anyio.sleep(1)
                continue
            found: Any = await r.xread(dict(last), count=500, block=1000)  # type: ignore[arg-type]
            for key, entries in found or ():
                name = key.decode() if isinstance(key, bytes) else str(key)
                for entry_id, fields in entries:
                    last[name] = entry_id.decode()
                    yield _event(
                        name, fields.get(b"event_id", b"").decode(), fields.get(b"data", b"{}")
                    )
    finally:
        await r.aclose()
