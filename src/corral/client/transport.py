"""The client's default transport: httpx's own, over connections whose writes made before the
next read leave in one send.

httpcore writes a request's head and its body with a send each. On loopback every send costs
the kernel's whole TCP path, and the engine wakes twice for one request: once for the head,
once for the body (bench/api.py). A request is written whole before its answer is read, so
gathering the writes until that read sends one segment and changes nothing else. A large body
is not held in memory: past `FLUSH_AT` bytes the gathered writes leave at once."""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

FLUSH_AT = 64 * 1024  # bytes gathered at most before they are sent


class GatheringStream(httpcore.AsyncNetworkStream):
    """A connection whose writes are held until the next read (or `FLUSH_AT` bytes)."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._gathered: list[bytes] = []
        self._size = 0

    async def _flush(self, timeout: float | None) -> None:
        if self._gathered:
            data = b"".join(self._gathered)
            self._gathered.clear()
            self._size = 0
            await self._stream.write(data, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._gathered.append(buffer)
        self._size += len(buffer)
        if self._size >= FLUSH_AT:
            await self._flush(timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._flush(timeout)
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._gathered.clear()  # a request not read for is abandoned, as its connection
        self._size = 0
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._flush(timeout)
        return GatheringStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class GatheringBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, handing out `GatheringStream` connections."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return GatheringStream(
            await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return GatheringStream(
            await self._backend.connect_unix_socket(path, timeout, socket_options)
        )

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def gathering_transport(
    backend: httpcore.AsyncNetworkBackend | None = None,
) -> httpx.AsyncHTTPTransport:
    """httpx's default transport (the same TLS checks, limits and retries) with gathered
    writes, over `backend` (default: httpcore's own)."""
    transport = httpx.AsyncHTTPTransport()
    pool = transport._pool  # httpx builds it; only its network backend is wrapped
    assert isinstance(pool, httpcore.AsyncConnectionPool)  # no proxy is given here
    pool._network_backend = GatheringBackend(backend or pool._network_backend)
    return transport
