"""API tokens (domain/tokens.py, services/tokens.py): scopes, lifetimes, and authentication that
answers every bad token alike."""

from __future__ import annotations

import asyncio

import pytest

from corral.domain.errors import InvalidRequest
from corral.domain.tokens import parse_scopes, split_token
from corral.services import tokens
from corral.store.memory import MemoryStore


def test_scopes_are_known_ones_each_once_in_order() -> None:
    assert parse_scopes("approve, jobs:read,approve") == ("jobs:read", "approve")
    with pytest.raises(InvalidRequest, match="unknown scope"):
        parse_scopes("jobs:read,root")
    with pytest.raises(InvalidRequest, match="at least one scope"):
        parse_scopes(" , ")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45", 45), ("2w", 14 * 86400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert tokens.duration_s(text) == seconds


@pytest.mark.parametrize("text", ["0", "-1d", "3x", "", "99999w"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidRequest):
        tokens.duration_s(text)


def test_a_token_authenticates_until_it_expires_or_is_revoked() -> None:
    async def main() -> None:
        store = MemoryStore()
        clock = [1000.0]
        made = await tokens.create(
            store,
            tenant="acme",
            scopes="jobs:read",
            by="op",
            expires_in_s=60,
            clock=lambda: clock[0],
        )
        assert made.text.startswith("crl_") and made.token.secret_hash not in made.text
        found = await tokens.authenticate(store, made.text, clock=lambda: clock[0])
        assert found == made.token and found.allows("jobs:read") and not found.allows("govern")
        token_id, secret = split_token(made.text) or ("", "")
        for bad in (
            "",
            "Bearer x",
            f"crl_{token_id}_{secret}x",
            f"crl_zz_{secret}",
            f"crl_{token_id}_",
        ):
            assert await tokens.authenticate(store, bad, clock=lambda: clock[0]) is None
        clock[0] += 61
        assert await tokens.authenticate(store, made.text, clock=lambda: clock[0]) is None
        other = await tokens.create(store, tenant="acme", scopes="admin", by="op")
        assert other.token.allows("govern")
        await tokens.revoke(store, other.token.id, by="op")
        assert await tokens.authenticate(store, other.text) is None

    asyncio.run(main())
