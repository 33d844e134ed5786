"""The HTTP API's bearer tokens in memory, with the semantics of store/tokens_sql.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from corral.domain.errors import Conflict, NotFound
from corral.domain.tokens import CREATED, REVOKED, ApiToken, TokenEvent
from corral.store.govrows import token_event_from_row, token_event_row


class MemoryTokens:
    """Mixed into MemoryStore."""

    _tokens: dict[str, ApiToken]

    _append: Callable[[str, Mapping[str, Any]], Mapping[str, Any]]  # MemoryGovernance's chains
    _rows: Callable[[str], Iterator[Mapping[str, Any]]]

    async def create_token(self, token: ApiToken) -> None:
        if token.id in self._tokens:
            raise Conflict(f"token {token.id} exists already")
        self._append(
            "token_events",
            token_event_row(token, CREATED, at=token.created_at, by=token.created_by),
        )
        self._tokens[token.id] = token

    async def token(self, token_id: str) -> ApiToken:
        try:
            return self._tokens[token_id]
        except KeyError:
            raise NotFound(f"no token {token_id}") from None

    async def tokens(self) -> list[ApiToken]:
        return sorted(self._tokens.values(), key=lambda t: (t.created_at, t.id))

    async def revoke_token(self, token_id: str, *, at: float, by: str) -> ApiToken:
        token = await self.token(token_id)
        if token.revoked_at is not None:
            raise Conflict(f"token {token_id} is already revoked")
        self._tokens[token_id] = replace(token, revoked_at=at, revoked_by=by)
        self._append("token_events", token_event_row(token, REVOKED, at=at, by=by))
        return self._tokens[token_id]

    async def token_events(self) -> list[TokenEvent]:
        return [token_event_from_row(r) for r in self._rows("token_events")]
