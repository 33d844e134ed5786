"""corral.client's calls in process (its AsyncClient over httpx's ASGI transport, the app over
the in-memory store): approvals listed, approved and denied as the token's; the DLQ purged;
tokens made, listed and revoked by an admin; every error answer one ApiError with its status,
code and Retry-After. tests/acceptance/test_client.py runs the client against a live engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import httpcore
import httpx
import pytest

from corral.api import create_app
from corral.client import ApiError, AsyncClient, RateLimited
from corral.client.transport import FLUSH_AT, GatheringBackend, gathering_transport
from corral.config import Config
from corral.services import tokens
from corral.store.memory import MemoryStore
from tests.unit.test_api_governance import GATED
from tests.unit.test_api_jobs import config

Body = Callable[[dict[str, AsyncClient], MemoryStore], Awaitable[None]]


def with_clients(cfg: Config, body: Body) -> None:
    async def main() -> None:
        store = MemoryStore()
        app = create_app(cfg, store, wake=lambda op: None)
        clients = {}
        for who, scopes in (("writer", "jobs:read,jobs:write"), ("approver", "approve")):
            made = await tokens.create(store, tenant="acme", scopes=scopes, by="test")
            clients[who] = AsyncClient(
                "http://test", made.text, transport=httpx.ASGITransport(app=app)
            )
        admin = await tokens.create(store, tenant="acme", scopes="admin", by="test")
        clients["admin"] = AsyncClient(
            "http://test", admin.text, transport=httpx.ASGITransport(app=app)
        )
        try:
            await body(clients, store)
        finally:
            for c in clients.values():
                await c.aclose()

    anyio.run(main)


@pytest.mark.parametrize("approve", [True, False])
def test_approvals_through_the_client(tmp_path: Path, approve: bool) -> None:
    async def body(c: dict[str, AsyncClient], store: MemoryStore) -> None:
        job = (await c["writer"].submit(["true"], role="gated")).job
        assert job.state.value == "AWAITING_APPROVAL"
        pending = await c["approver"].approvals(state="pending")
        assert [a.dump()["job_id"] for a in pending] == [job.id]
        ident = pending[0].dump()["id"]
        decide = c["approver"].approve if approve else c["approver"].deny
        decided = (await decide(ident, note="looked at it")).dump()
        assert decided["state"] == ("approved" if approve else "denied")
        assert decided["decided_by"].startswith("token:")
        with pytest.raises(ApiError) as twice:
            await decide(ident)
        assert twice.value.status == 409
        with pytest.raises(ApiError) as scoped:
            await c["writer"].approvals()
        assert (scoped.value.status, scoped.value.code) == (403, "not_permitted")

    with_clients(config(tmp_path, GATED), body)


def test_tokens_and_the_dlq_through_the_client(tmp_path: Path) -> None:
    async def body(c: dict[str, AsyncClient], store: MemoryStore) -> None:
        made = await c["admin"].create_token(["jobs:read"], tenant="globex", name="x")
        assert made.tenant == "globex" and made.token.startswith("crl_")
        assert made.id in [t.id for t in await c["admin"].tokens()]
        assert (await c["admin"].revoke_token(made.id)).revoked_at is not None
        with pytest.raises(ApiError) as again:
            await c["admin"].revoke_token(made.id)
        assert again.value.code == "conflict"
        with pytest.raises(ApiError) as not_admin:
            await c["writer"].tokens()
        assert not_admin.value.status == 403
        assert (await c["writer"].dlq()).jobs == []
        with pytest.raises(ApiError) as nothing:
            await c["writer"].requeue("0" * 26)
        assert nothing.value.status == 404
        assert (await c["writer"].purge(every=True)).purged == []

    with_clients(config(tmp_path), body)


def test_the_rate_limit_is_a_typed_error_with_retry_after(tmp_path: Path) -> None:
    text = "api: {rate_limit: {per_s: 0.001, burst: 2}}\n"

    async def body(c: dict[str, AsyncClient], store: MemoryStore) -> None:
        await c["writer"].list()
        await c["writer"].list()
        with pytest.raises(RateLimited) as limited:
            await c["writer"].list()
        assert limited.value.status == 429 and limited.value.retry_after is not None
        assert limited.value.retry_after >= 1

    with_clients(config(tmp_path, text), body)


class _Wire(httpcore.AsyncNetworkStream):
    """A connection that records each write and answers one canned response."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.answer = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.answer.pop(0) if self.answer else b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.writes.append(buffer)

    async def aclose(self) -> None:
        pass


class _Backend(httpcore.AsyncNetworkBackend):
    def __init__(self, wire: _Wire) -> None:
        self.wire = wire

    async def connect_tcp(self, *args: object, **kwargs: object) -> httpcore.AsyncNetworkStream:
        return self.wire


def test_the_client_sends_a_requests_head_and_body_in_one_write() -> None:
    """httpcore writes the head and the body apart; the client's transport gathers them until
    the answer is read (one segment, one wake-up of the engine), and past FLUSH_AT bytes
    sends what it holds at once."""

    async def main() -> None:
        wire = _Wire()
        async with httpx.AsyncClient(transport=gathering_transport(_Backend(wire))) as http:
            assert (await http.post("http://test/api", json={"command": ["true"]})).json() == {}
        assert len(wire.writes) == 1
        assert wire.writes[0].startswith(b"POST /api ")
        assert wire.writes[0].endswith(b'{"command":["true"]}')

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield b"x" * (FLUSH_AT // 2)

        streamed = _Wire()
        async with httpx.AsyncClient(transport=gathering_transport(_Backend(streamed))) as http:
            await http.post("http://test/api", content=chunks())
        sizes = [len(w) for w in streamed.writes]
        assert len(sizes) == 3 and all(n >= FLUSH_AT for n in sizes[:2]), sizes
        assert sum(sizes) > 2 * FLUSH_AT

    anyio.run(main)


def test_the_clients_default_transport_gathers_writes_and_proxies_still_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def pool(client: AsyncClient, url: str) -> object:
        return client._http._transport_for_url(httpx.URL(url))._pool  # type: ignore[attr-defined]

    client = AsyncClient("http://127.0.0.1:9", "t")
    assert isinstance(pool(client, "http://127.0.0.1:9/api")._network_backend, GatheringBackend)  # type: ignore[attr-defined]
    anyio.run(client.aclose)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    proxied = AsyncClient("http://127.0.0.1:9", "t")
    assert isinstance(pool(proxied, "http://engine.example:8765/api"), httpcore.AsyncHTTPProxy)
    anyio.run(proxied.aclose)


def test_a_call_goes_through_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls go straight to the transport httpx picked for the API's URL (not through the httpx
    client): the proxy the environment names gets the request, in absolute form."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    seen: list[bytes] = []
    body = b'{"status":404,"code":"not_found","detail":"no job j1"}'
    answer = (
        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/problem+json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )

    async def proxy(conn: anyio.abc.SocketStream) -> None:
        async with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await conn.receive()
            seen.append(head.split(b"\r\n")[0])
            await conn.send(answer)

    async def main() -> ApiError:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        client = AsyncClient("http://engine.example:8765", "t", timeout_s=10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, proxy)
            with pytest.raises(ApiError) as caught:
                await client.get("j1")
            await client.aclose()
            tg.cancel_scope.cancel()
        return caught.value

    err = anyio.run(main)
    assert err.status == 404
    assert seen == [b"GET http://engine.example:8765/api/v1/jobs/j1 HTTP/1.1"]
