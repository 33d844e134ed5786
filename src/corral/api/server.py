"""The HTTP API inside a running engine: uvicorn's `Server.serve()` as one more task of the
engine's task group (runtime/engine.py), over the engine's own open store, waking its
dispatcher directly. The socket is bound before the engine starts, so a busy port is said at
once (`Listener.bind`)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from corral.domain.errors import InvalidRequest
from corral.runtime.engine import Engine

from .app import UiMount, create_app

log = logging.getLogger(__name__)
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765
# How long a request may take to arrive whole, head and body (`_CoalescingProtocol`): a body at
# its 4 MiB limit over a link of 150 KB/s
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpOptions:
    """Where `corral serve` listens (`--http HOST:PORT`) and how (TLS files, or plain HTTP on a
    non-loopback address only with `insecure`)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure: bool = False

    @classmethod
    def parse(cls, address: str, **kw: object) -> HttpOptions:
        """`HOST:PORT` (`[::1]:8765` for IPv6), checked: a port 0 … 65535, TLS files in
        pairs, plain HTTP beyond loopback only when asked for."""
        host, sep, port_text = address.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
            raise InvalidRequest(f"--http wants HOST:PORT (e.g. 127.0.0.1:8765), not {address!r}")
        opts = cls(host=host, port=int(port_text), **kw)  # type: ignore[arg-type]
        opts.check()
        return opts

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def check(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidRequest("--tls-cert and --tls-key go together")
        if not self.tls and not self.insecure and not _loopback(self.host):
            raise InvalidRequest(
                f"--http {self.host}: serving beyond loopback needs TLS (--tls-cert and "
                "--tls-key) or --insecure-http to send tokens in the clear"
            )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Listener:
    """The bound socket, ready before the engine starts."""

    def __init__(self, opts: HttpOptions, sock: socket.socket, ui: UiMount | None = None) -> None:
        self.opts, self.sock, self.ui = opts, sock, ui

    @classmethod
    def bind(cls, opts: HttpOptions, ui: UiMount | None = None) -> Listener:
        """Bind now; InvalidRequest naming the address when it is taken."""
        family = socket.AF_INET6 if ":" in opts.host else socket.AF_INET
        # The protocol named, not left 0: asyncio sets TCP_NODELAY only on sockets whose `proto`
        # says TCP, and without it every answer on a kept-alive connection waited ~40 ms
        # (Nagle's algorithm holding the body until the client's delayed ACK of the headers).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((opts.host, opts.port))
        except OSError as err:
            sock.close()
            raise InvalidRequest(
                f"cannot serve HTTP on {opts.host}:{opts.port}: "
                f"{err.strerror or err} (another engine or program holds it? "
                "pick --http HOST:PORT, or --no-http)"
            ) from None
        sock.listen(128)
        sock.setblocking(False)
        return cls(opts, sock, ui)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self.opts.tls else 'http'}://{shown}:{port}"

    async def serve(self, engine: Engine) -> None:
        """Serve the API over the engine's store until the engine's task group is cancelled."""
        app = create_app(engine.config, engine.store, wake=engine.wake, ui=self.ui)
        # a kill switch, pause or budget made with the CLI pokes the engine: the API's kept
        # submission service reads them again for its next submission
        engine.wake_listeners.append(app.state.corral.submissions.heard)
        config = uvicorn.Config(
            app,
            lifespan="off",
            http=_CoalescingProtocol,
            log_level="warning",
            access_log=False,
            ssl_certfile=str(self.opts.tls_cert) if self.opts.tls_cert else None,
            ssl_keyfile=str(self.opts.tls_key) if self.opts.tls_key else None,
        )
        server = _EngineServer(config)
        try:
            async with app.router.lifespan_context(app):  # the MCP transport's task group
                await server.serve(sockets=[self.sock])
        finally:
            with anyio.CancelScope(shield=True):
                server.should_exit = True
                self.sock.close()


class _Coalescing:
    """A transport whose writes made in one turn of the event loop leave in one send.

    uvicorn writes an answer's status line and headers, then its body, each with a send of its
    own: on loopback every send costs the kernel's whole TCP path and wakes the client, and the
    second one a fifth of the engine's time under 8 clients (bench/api.py). Gathered, the two
    are one segment. The bytes go out at the start of the loop's next turn, in order; closing
    sends what is gathered first, aborting drops it (as the transport's own buffer)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._gathered: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._gathered:
            self._loop.call_soon(self._flush)
        self._gathered.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if self._gathered:
            data = b"".join(self._gathered)
            self._gathered.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._gathered))

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._gathered.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # get_extra_info, is_closing, pause_reading …
        return getattr(self._transport, name)


class _CoalescingProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) over `_Coalescing`, with a deadline for each
    request to arrive whole.

    uvicorn times out a connection only while it idles between requests: one that sends part
    of a request's head (or a body a byte at a time) and then nothing is held open for ever,
    and enough of them take every descriptor the engine has (slowloris). A request must now
    arrive whole, head and body, within REQUEST_TIMEOUT_S of the connection's start or of the
    previous answer; otherwise the connection is closed. An answer being written (a long poll,
    a followed log) is not a request arriving: no deadline runs then."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalescing = _Coalescing(cast(asyncio.Transport, transport))
        super().connection_made(cast(asyncio.Transport, coalescing))  # the methods it calls
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # not when a pipelined request's answer has just started

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(REQUEST_TIMEOUT_S, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class _EngineServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the engine handles SIGTERM/SIGINT and stops
    this server by cancelling its task group."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(
    address: str,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    insecure: bool = False,
    ui: UiMount | None = None,
) -> Listener:
    """Check the options and bind `address` (`HOST:PORT`): what `corral serve` calls before
    starting the engine (cli/__init__.py, wired in corral/main.py); `ui`: the dashboard."""
    return Listener.bind(
        HttpOptions.parse(address, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure), ui
    )
