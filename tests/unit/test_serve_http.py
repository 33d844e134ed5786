"""Where `corral serve` serves HTTP (api/server.py, cli/__init__.py): addresses checked, plain
HTTP beyond loopback only when asked for, a taken address said clearly — an error when it was
given, a warning and no HTTP when it was the default."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from corral import cli
from corral.api.server import HttpOptions, Listener, _Coalescing, listen
from corral.config import load
from corral.domain.errors import InvalidRequest
from corral.runtime.engine import Engine


@pytest.mark.parametrize("address", ["127.0.0.1", ":80", "127.0.0.1:70000", "h:p", "h:-1"])
def test_bad_addresses(address: str) -> None:
    with pytest.raises(InvalidRequest, match="HOST:PORT"):
        HttpOptions.parse(address)


def test_beyond_loopback_needs_tls_or_insecure() -> None:
    for host in ("0.0.0.0", "10.1.2.3", "example.org"):
        with pytest.raises(InvalidRequest, match="--insecure-http"):
            HttpOptions.parse(f"{host}:8765")
        assert HttpOptions.parse(f"{host}:8765", insecure=True).host == host
    assert HttpOptions.parse("[::1]:8765").host == "::1"
    assert HttpOptions.parse("localhost:0").port == 0
    tls = HttpOptions.parse("0.0.0.0:8443", tls_cert=Path("c"), tls_key=Path("k"))
    assert tls.tls
    with pytest.raises(InvalidRequest, match="together"):
        HttpOptions.parse("127.0.0.1:1", tls_cert=Path("c"))


def test_a_taken_address_is_an_error_when_given_and_a_warning_by_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        with pytest.raises(InvalidRequest, match=f"cannot serve HTTP on {taken}"):
            cli._http_listener(listen, taken, tls_cert=None, tls_key=None, insecure=False)

        def busy_default(address: str, **_: object) -> Listener:
            assert address == cli.DEFAULT_HTTP
            return listen(taken)

        assert (
            cli._http_listener(busy_default, None, tls_cert=None, tls_key=None, insecure=False)
            is None
        )
    err = capsys.readouterr().err
    assert f"warning: cannot serve HTTP on {taken}" in err and "without the HTTP API" in err


def test_a_free_port_is_bound_before_the_engine_starts() -> None:
    bound = listen("127.0.0.1:0")
    try:
        assert bound.url.startswith("http://127.0.0.1:") and not bound.url.endswith(":0")
    finally:
        bound.sock.close()


def test_answers_leave_at_once_the_accepted_sockets_are_tcp_nodelay() -> None:
    """The bound socket says it is TCP, so asyncio turns Nagle off on every connection it
    accepts: an answer written as a head then a body does not wait for the client's delayed
    ACK (without it each request took ~40 ms more; bench/api.py measures it)."""
    import asyncio

    listener = Listener.bind(HttpOptions(port=0))
    seen: list[int] = []

    async def main() -> None:
        accepted = asyncio.Event()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()
                accepted.set()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener.sock)
        try:
            host, port = listener.sock.getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
            await asyncio.wait_for(accepted.wait(), timeout=5)
            writer.close()
        finally:
            server.close()

    assert listener.sock.proto == socket.IPPROTO_TCP
    asyncio.run(main())
    assert seen and seen[0] != 0


class _Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_the_writes_of_one_loop_turn_leave_in_one_send_and_close_sends_them_first() -> None:
    async def main() -> None:
        inner = _Recording()
        t = _Coalescing(inner)
        t.write(b"HTTP/1.1 201 Created\r\n\r\n")
        t.write(b'{"created":true}')
        assert inner.sent == [] and t.get_write_buffer_size() == 40
        await asyncio.sleep(0)  # the loop's next turn
        assert inner.sent == [b'HTTP/1.1 201 Created\r\n\r\n{"created":true}']
        t.write(b"a")
        await asyncio.sleep(0)
        t.write(b"b")
        t.writelines([b"c", b""])
        t.close()  # what is gathered goes out before the close
        assert inner.sent[1:] == [b"a", b"bc"] and inner.closed
        assert t.is_closing()  # the rest is the transport's own

    asyncio.run(main())


def test_the_engines_wake_for_a_submission_dispatches_and_writes_no_report(
    tmp_path: Path,
) -> None:
    """The wake an edge inside the engine calls: "submitted" (a submission that ended no job)
    wakes the dispatcher only; "wake" (a cancel, a change) wakes the reporter too."""
    (tmp_path / "corral.yaml").write_text("roles:\n  default: {}\n")
    engine = Engine(load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml"))
    assert engine.wake("submitted")
    assert engine.dispatcher._wake.is_set() and not engine.reporter._wake.is_set()
    assert engine.wake("wake")
    assert engine.reporter._wake.is_set()


def test_a_request_must_arrive_whole_in_time_an_answer_may_take_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that sends part of a request (its head, or a body a byte at a time) is
    closed once REQUEST_TIMEOUT_S passes; one whose answer takes longer is not."""
    import uvicorn

    from corral.api import server as srv

    monkeypatch.setattr(srv, "REQUEST_TIMEOUT_S", 0.3)
    release = asyncio.Event()  # the answer is held until a later connection's deadline passed

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await release.wait()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"14")]}
        )
        await send({"type": "http.response.body", "body": b"late but whole"})

    async def closed_after(port: int, data: bytes) -> float | None:
        """Seconds until the server closed the connection (None: it answered instead)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        t0 = asyncio.get_running_loop().time()
        got = await asyncio.wait_for(reader.read(100), timeout=10)
        writer.close()
        return None if got else asyncio.get_running_loop().time() - t0

    async def main() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # connections wait in the backlog until the server accepts them
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, lifespan="off", http=srv._CoalescingProtocol, log_level="error"
        )
        server = srv._EngineServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            head = b"POST / HTTP/1.1\r\nHost: x\r\n"
            whole = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(whole)  # arrives whole; its answer waits for `release`
            assert (await closed_after(port, head)) is not None  # a head that never ends
            body = head + b"Content-Length: 10\r\n\r\n1"
            assert (await closed_after(port, body)) is not None  # a body that never ends
            release.set()  # two deadlines have passed since the first request arrived
            answer = await asyncio.wait_for(reader.readuntil(b"late but whole"), timeout=10)
            assert answer.startswith(b"HTTP/1.1 200")
            writer.write(head)  # then part of a second request on the same connection
            assert await asyncio.wait_for(reader.read(100), timeout=10) == b""
            writer.close()
        finally:
            release.set()  # a failed check must not leave the answer held and the server up
            server.should_exit = True
            await task

    asyncio.run(main())
