"""The brokers committed records are published to (docs/how-to/events.md): NATS JetStream and
Redis Streams. A sink publishes a batch whole or raises; it reconnects on the next batch after a
failure, and every wait is bounded by the sink's `timeout_s`, so a broker that is down or slow
costs the drainer (trace/drain.py) time, never the dispatcher.

JetStream drops a second copy of an event by its `Nats-Msg-Id` header (the stream's duplicate
window, 2 minutes by default); a Redis stream entry carries the id in its `event_id` field for
the consumer to drop a second copy.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import anyio
import nats
from nats.aio.client import Client as Nats
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from redis.asyncio import Redis

from corral.domain.settings import SinkSpec
from corral.trace.events import AGENT_SUBJECT, GOVERNANCE_PREFIX, JOB_PREFIX, SUBJECTS, Event

log = logging.getLogger(__name__)
MSG_ID = "Nats-Msg-Id"


class Sink(Protocol):
    """Where the drainer publishes."""

    spec: SinkSpec

    async def publish(self, events: Sequence[Event]) -> None:
        """Publish every event, in order, or raise (then none counts as published)."""

    async def close(self) -> None: ...


async def _quiet(err: Exception) -> None:
    """nats-py reports connection trouble here; the drainer logs the failure it causes."""
    log.debug("nats: %s", err)


class NatsSink:
    """JetStream: each event on its subject, `Nats-Msg-Id` set to its id."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec
        self._nc: Nats | None = None
        self._js: JetStreamContext | None = None

    async def _connect(self) -> JetStreamContext:
        if self._nc is not None and self._js is not None and self._nc.is_connected:
            return self._js
        await self.close()
        with anyio.fail_after(self.spec.timeout_s):
            nc = await nats.connect(
                self.spec.url,
                name="corral-events",
                allow_reconnect=False,
                connect_timeout=max(1, math.ceil(self.spec.timeout_s)),
                error_cb=_quiet,
            )
            self._nc = nc
            js = nc.jetstream(timeout=self.spec.timeout_s)
            try:
                await js.stream_info(self.spec.stream)
            except NotFoundError:
                await js.add_stream(name=self.spec.stream, subjects=list(SUBJECTS))
        self._js = js
        return js

    async def publish(self, events: Sequence[Event]) -> None:
        js = await self._connect()
        t = self.spec.timeout_s
        try:
            # No `wait_stall`: with one, nats-py wraps each message's semaphore acquire in
            # asyncio.wait_for, a task per message that yields to the loop, and the loop's
            # flusher then wrote every message with a send of its own (a sixth of the engine's
            # time under W1, bench/events.py). Without it the acquire returns at once while
            # fewer than nats-py's 4,000 acks are pending (`events.batch`: 500 by default), so
            # the batch leaves in one write; past that it waits for acks, and fail_after still
            # bounds a stall.
            with anyio.fail_after(t * 2):
                acks = [
                    await js.publish_async(
                        e.subject,
                        e.payload(),
                        stream=self.spec.stream,
                        headers={MSG_ID: e.event_id},
                    )
                    for e in events
                ]
                for ack in acks:
                    await ack
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            with anyio.move_on_after(self.spec.timeout_s, shield=True):
                await nc.close()


class RedisSink:
    """Redis Streams: each event appended to the stream named like its subject."""

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec
        self._redis: Redis | None = None

    def _client(self) -> Redis:
        if self._redis is None:
            self._redis = Redis.from_url(
                self.spec.url,
                socket_timeout=self.spec.timeout_s,
                socket_connect_timeout=self.spec.timeout_s,
            )
        return self._redis

    async def publish(self, events: Sequence[Event]) -> None:
        r = self._client()
        try:
            with anyio.fail_after(self.spec.timeout_s * 2):
                async with r.pipeline(transaction=False) as pipe:
                    for e in events:
                        pipe.xadd(
                            e.subject,
                            {"event_id": e.event_id, "data": e.payload()},
                            maxlen=self.spec.maxlen,
                            approximate=True,
                        )
                    await pipe.execute()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        r, self._redis = self._redis, None
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
