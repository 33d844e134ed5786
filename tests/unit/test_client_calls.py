"""corral.client's calls in process (its AsyncClient over httpx's ASGI transport, the app over
the in-memory store): approvals listed, approved and denied as the token's; the DLQ purged;
tokens made, listed and revoked by an admin; every error answer one ApiError with its status,
code and Retry-After. tests/acceptance/test_client.py runs the client against a live engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import pytest

from corral.api import create_app
from corral.client import ApiError, AsyncClient, RateLimited
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
