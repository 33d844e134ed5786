"""Brokers of a test's own: a NATS server with JetStream and a Redis server on free loopback
ports, started and stopped by the test (never the shared ones on 4222 and 6379)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import nats
import redis

from tests.helpers import eventually

NATS_SERVER = "/usr/sbin/nats-server"
REDIS_SERVER = "redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Broker:
    """One broker process of the test's own; `stop` kills that pid only."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:
        self.argv, self.port, self.log = argv, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL
            )
        proc = self.proc

        def up() -> bool:
            assert proc.poll() is None, self.log.read_text(errors="replace")
            return _answers(self.port)

        eventually(up, timeout=15, what="the broker answering on its port")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def nats_broker(tmp: Path) -> Broker:
    port = free_port()
    store = tmp / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    return Broker(
        [NATS_SERVER, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        port,
        tmp / "nats.log",
    )


def redis_broker(tmp: Path) -> Broker:
    port = free_port()
    return Broker(
        [
            REDIS_SERVER,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        port,
        tmp / "redis.log",
    )


def jetstream_ids(port: int, stream: str = "CORRAL") -> list[str]:
    """The `Nats-Msg-Id` of every message the stream holds, in stream order."""

    async def read() -> list[str]:
        nc = await nats.connect(
            f"nats://127.0.0.1:{port}", connect_timeout=2, allow_reconnect=False
        )
        try:
            js = nc.jetstream(timeout=2)
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                return []
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append((msg.headers or {}).get("Nats-Msg-Id", ""))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def redis_entries(port: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(stream key, event id, body) of every entry of every stream key the sinks write."""
    import json

    r = redis.Redis(host="127.0.0.1", port=port)
    out = []
    for pattern in ("mp.agent.events", "corral.*"):
        for key in r.scan_iter(match=pattern, _type="stream"):
            for _, fields in r.xrange(key):
                out.append(
                    (key.decode(), fields[b"event_id"].decode(), json.loads(fields[b"data"]))
                )
    r.close()
    return out
