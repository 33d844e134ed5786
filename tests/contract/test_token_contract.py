"""The token contract (the TokenStore port, core/ports.py), on the memory, SQLite and PostgreSQL
stores: a token is recorded with only its secret's hash, found by id, listed oldest first, and
revoked once (never deleted)."""

from __future__ import annotations

import pytest

from corral.core.ports import Store
from corral.domain.errors import Conflict, NotFound
from corral.domain.ids import new_id
from corral.domain.tokens import ApiToken, hash_secret, matches
from tests.contract.test_store_contract import NOW, UseStore


def a_token(**overrides: object) -> ApiToken:
    fields: dict[str, object] = {
        "id": new_id(),
        "name": "ci",
        "tenant": "acme",
        "scopes": ("jobs:read", "approve"),
        "secret_hash": hash_secret("s3cret"),
        "created_at": NOW,
        "created_by": "operator",
        "expires_at": NOW + 3600,
    }
    fields.update(overrides)
    return ApiToken(**fields)  # type: ignore[arg-type]


def test_a_token_is_found_by_id_with_every_field(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        token = a_token()
        await store.create_token(token)
        found = await store.token(token.id)
        assert found == token
        assert matches(found, "s3cret") and not matches(found, "guess")
        with pytest.raises(NotFound):
            await store.token(new_id())

    use_store(body)


def test_tokens_are_listed_oldest_first_and_revoked_once(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        older, newer = a_token(created_at=NOW), a_token(created_at=NOW + 1, expires_at=None)
        await store.create_token(newer)
        await store.create_token(older)
        assert [t.id for t in await store.tokens()] == [older.id, newer.id]
        revoked = await store.revoke_token(older.id, at=NOW + 5, by="token:x")
        assert (revoked.revoked_at, revoked.revoked_by) == (NOW + 5, "token:x")
        assert await store.token(older.id) == revoked
        assert not revoked.live_at(NOW + 6) and (await store.token(newer.id)).live_at(NOW + 6)
        with pytest.raises(Conflict):
            await store.revoke_token(older.id, at=NOW + 6, by="operator")
        with pytest.raises(NotFound):
            await store.revoke_token(new_id(), at=NOW, by="operator")
        assert len(await store.tokens()) == 2

    use_store(body)


def test_creating_and_revoking_a_token_is_on_the_audit_chain(use_store: UseStore) -> None:
    """Who made or revoked which token, for which tenant and scopes — and never the token's
    secret nor its hash — on a chain `verify_audit` checks."""

    async def body(store: Store) -> None:
        token = a_token(name="deploy")
        await store.create_token(token)
        await store.revoke_token(token.id, at=NOW + 5, by="token:admin1")
        with pytest.raises(Conflict):  # a refused revocation records nothing
            await store.revoke_token(token.id, at=NOW + 6, by="operator")
        events = await store.token_events()
        assert [(e.token_id, e.action, e.actor, e.at) for e in events] == [
            (token.id, "created", "operator", NOW),
            (token.id, "revoked", "token:admin1", NOW + 5),
        ]
        assert events[0].tenant == "acme" and events[0].scopes == ("jobs:read", "approve")
        assert events[0].name == "deploy" and events[0].expires_at == NOW + 3600
        assert token.secret_hash not in repr(events)
        report = await store.verify_audit()
        assert report.ok, report

    use_store(body)
