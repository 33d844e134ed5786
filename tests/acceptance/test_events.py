"""Committed records reach the brokers (docs/how-to/events.md), with brokers of the test's own
(tests/brokers.py): a broker killed mid-run and brought back gets every event and, on
JetStream, none twice; an engine SIGKILLed while its broker was down has its events published by
the next engine; dispatch goes on while the brokers are away."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.domain.settings import SinkSpec
from corral.domain.tokens import split_token
from corral.store.sqlite import SqliteStore
from corral.trace.events import SOURCES, record_event
from corral.trace.sinks import RedisSink, follow
from tests.acceptance.conftest import CONFIG, CORRAL, Corral
from tests.acceptance.test_json_schemas import conforms
from tests.brokers import Broker, jetstream_ids, nats_broker, redis_broker, redis_entries
from tests.helpers import eventually

TOKEN_SUBJECT = "corral.governance.token"


def _config(nats: Broker | None, redis: Broker | None) -> str:
    sinks = []
    if nats is not None:
        sinks.append(f"    - {{kind: nats, url: 'nats://127.0.0.1:{nats.port}', timeout_s: 1}}")
    if redis is not None:
        sinks.append(
            f"    - {{kind: redis, url: 'redis://127.0.0.1:{redis.port}/0', timeout_s: 1}}"
        )
    return (
        CONFIG + "events:\n  poll_s: 0.1\n  max_backoff_s: 1\n  sinks:\n" + "\n".join(sinks) + "\n"
    )


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    nats, redis = nats_broker(tmp_path / "nats"), redis_broker(tmp_path)
    try:
        yield nats, redis
    finally:
        for broker in (nats, redis):
            if broker.proc is not None:
                broker.resume()
            broker.stop()


def committed(corral: Corral) -> dict[str, str]:
    """Event id → subject of every committed record (what must be published)."""

    async def read() -> dict[str, str]:
        store = SqliteStore(corral.data / "corral.db")
        await store.open()
        try:
            out = {}
            for source in SOURCES:
                for row in await store.outbox_rows(source, after=0, limit=1_000_000):
                    event = record_event(source, row)
                    out[event.event_id] = event.subject
            return out
        finally:
            await store.close()

    return asyncio.run(read())


def _make(tmp_path: Path, config: str) -> Corral:
    root = tmp_path / "corral"
    root.mkdir()
    return Corral(root, config)


def _all_on_jetstream(corral: Corral, nats: Broker) -> list[str] | None:
    ids = jetstream_ids(nats.port)
    return ids if set(ids) >= set(committed(corral)) else None


def test_a_broker_outage_mid_run_loses_nothing_and_jetstream_holds_no_duplicate(
    tmp_path: Path, brokers: tuple[Broker, Broker]
) -> None:
    nats, redis = brokers
    nats.start()
    redis.start()
    corral = _make(tmp_path, _config(nats, redis))
    try:
        first = [corral.submit("sh", "-c", "sleep 0.2") for _ in range(6)]
        corral.serve()
        for job_id in first:
            assert corral.wait(job_id) == 0
        eventually(lambda: jetstream_ids(nats.port) or None, what="events on JetStream")
        nats.stop(signal.SIGKILL)  # JetStream gone mid-run (its store survives on disk)
        redis.pause()  # Redis hangs: every publish times out
        second = [corral.submit("sh", "-c", "exit 0") for _ in range(6)]
        for job_id in second:  # dispatch does not wait for the brokers
            assert corral.wait(job_id, timeout=20) == 0
        assert [corral.job(i)["state"] for i in first + second] == ["SUCCEEDED"] * 12
        nats.start()
        redis.resume()
        ids = eventually(
            lambda: _all_on_jetstream(corral, nats),
            timeout=60,
            what="every committed record on JetStream",
        )
        expected = committed(corral)
        twice = [i for i, n in Counter(ids).items() if n > 1]
        assert not twice, f"published twice on JetStream: {twice}"
        assert set(ids) == set(expected)

        def all_on_redis() -> list[tuple[str, str, dict[str, object]]] | None:
            found = redis_entries(redis.port)
            return found if {i for _, i, _ in found} >= set(expected) else None

        entries = eventually(all_on_redis, timeout=60, what="every committed record on Redis")
        assert {i for _, i, _ in entries} == set(expected)
        assert all(expected[i] == key for key, i, _ in entries), "stream key = subject"
        states = {
            body.get("to_state") for key, _, body in entries if key.startswith("corral.jobs.")
        }
        assert {"QUEUED", "STARTING", "RUNNING", "SUCCEEDED"} <= states
        status = corral.ok("status")
        assert "events" in status
    finally:
        corral.stop_all()


def test_events_committed_before_an_engine_was_killed_are_published_by_the_next(
    tmp_path: Path, brokers: tuple[Broker, Broker]
) -> None:
    nats, _ = brokers  # not started: the broker is down while the jobs finish
    corral = _make(tmp_path, _config(nats, None))
    try:
        ids = [corral.submit("sh", "-c", "exit 0") for _ in range(4)]
        engine = corral.serve()
        for job_id in ids:
            assert corral.wait(job_id) == 0
        engine.send_signal(signal.SIGKILL)  # committed, never published
        engine.wait()
        nats.start()
        corral.serve()
        published = eventually(
            lambda: _all_on_jetstream(corral, nats),
            timeout=60,
            what="the dead engine's events on JetStream",
        )
        assert set(published) == set(committed(corral))
        assert len(published) == len(set(published))
        tailed = _tail(corral, len(published))
        assert sorted(e["event_id"] for e in tailed) == sorted(published)
        assert {e["subject"] for e in tailed} >= {"corral.jobs.queued", "corral.jobs.succeeded"}
    finally:
        corral.stop_all()


def _tail(corral: Corral, n: int) -> list[dict[str, Any]]:
    """The first `n` lines of `corral events tail --from-start --json`."""
    proc = subprocess.Popen(
        [CORRAL, "events", "tail", "--from-start", "--json"],
        env=corral.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while len(lines) < n and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(json.loads(line))
        assert len(lines) == n, proc.stderr.read() if proc.poll() is not None else lines
        return conforms("TailedEvent", lines, many=True)  # its published schema
    finally:
        proc.kill()
        proc.wait()


def test_a_redis_sink_keeps_each_subject_in_its_stream_and_tail_follows_them(
    tmp_path: Path, brokers: tuple[Broker, Broker]
) -> None:
    _, redis = brokers
    redis.start()
    spec = SinkSpec(
        name="r", kind="redis", url=f"redis://127.0.0.1:{redis.port}/0", maxlen=100, timeout_s=1
    )
    first = [
        record_event(
            "job_events",
            {"seq": i, "job_id": "j", "kind": "submitted", "to_state": "QUEUED", "data": "{}"},
        )
        for i in (1, 2)
    ]
    later = record_event("switch_events", {"seq": 1, "kind": "pause"})

    async def main() -> tuple[list[str], list[str]]:
        sink = RedisSink(spec)
        await sink.publish(first)
        old: list[str] = []
        with anyio.move_on_after(5):
            async for event in follow(spec, from_start=True):
                old.append(event.event_id)
                if len(old) == 2:
                    break
        new: list[str] = []
        seen = anyio.Event()

        async def publish_until_seen() -> None:
            # The follower starts "from now" at a moment the test cannot observe: publish until
            # it has seen the record (each later publish is after its start, so it is new to it).
            while not seen.is_set():
                await sink.publish([later])
                with anyio.move_on_after(0.2):
                    await seen.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish_until_seen)
            with anyio.move_on_after(5):
                async for event in follow(spec, from_start=False):
                    new.append(f"{event.subject} {event.event_id}")
                    break
            seen.set()
        await sink.close()
        return old, new

    old, new = asyncio.run(main())
    assert old == ["job_events:1", "job_events:2"]
    assert new == ["corral.governance.pause switch_events:1"]  # only what came after


def test_token_creations_and_revocations_reach_both_brokers_without_their_secret(
    tmp_path: Path, brokers: tuple[Broker, Broker]
) -> None:
    nats, redis = brokers
    nats.start()
    redis.start()
    corral = _make(tmp_path, _config(nats, redis))
    try:
        corral.serve()
        made = json.loads(
            corral.ok("token", "create", "--tenant", "acme", "--scopes", "jobs:read", "--json")
        )
        secret = made["token"]
        corral.ok("token", "revoke", made["id"])

        def tokens_on_redis() -> list[dict[str, Any]] | None:
            found = [b for key, _, b in redis_entries(redis.port) if key == TOKEN_SUBJECT]
            return found if len(found) == 2 else None

        bodies = eventually(tokens_on_redis, timeout=30, what="both token events on Redis")
        assert [(b["action"], b["token_id"], b["tenant"]) for b in bodies] == [
            ("created", made["id"], "acme"),
            ("revoked", made["id"], "acme"),
        ]
        assert all(b["source"] == "token_events" and b["scopes"] == "jobs:read" for b in bodies)
        expected = {i for i, s in committed(corral).items() if s == TOKEN_SUBJECT}
        assert len(expected) == 2
        ids = eventually(
            lambda: _all_on_jetstream(corral, nats), timeout=30, what="every record on JetStream"
        )
        assert expected <= set(ids) and len(ids) == len(set(ids))
        tailed = [e for e in _tail(corral, len(ids)) if e["subject"] == TOKEN_SUBJECT]
        assert {e["event_id"] for e in tailed} == expected
        # what a sink carries of a token: who, which tenant and scopes; never its secret or hash
        published = json.dumps([bodies, tailed])
        # the part after the id (the secret itself may hold "_": token_urlsafe's alphabet)
        split = split_token(secret)
        assert split is not None
        secret_part = split[1]
        assert secret_part not in published and "secret_hash" not in published
    finally:
        corral.stop_all()
