"""Bearer tokens of the HTTP API (domain/tokens.py): create one (its text is returned once, only
its hash is stored), list them, revoke one, and authenticate a presented token. The CLI
(`corral token`, cli/tokens.py) and the API (api/auth.py) both call these."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corral.core.ports import TokenStore
from corral.domain import bounds
from corral.domain.errors import InvalidRequest, NotFound
from corral.domain.ids import new_id
from corral.domain.tokens import (
    ApiToken,
    hash_secret,
    matches,
    new_secret,
    parse_scopes,
    split_token,
    token_text,
)

Clock = Callable[[], float]
MAX_TOKEN_LIFETIME_S = 10 * 366 * 24 * 3600.0  # ten years: longer is "never expires", say so
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


@dataclass(frozen=True, slots=True)
class Created:
    """A new token's record and its text, which is shown this once and never again."""

    token: ApiToken
    text: str


def duration_s(text: str, option: str = "--expires-in") -> float:
    """`30d`, `12h`, `90m`, `45s`, `2w` or plain seconds, as seconds within bounds."""
    m = _DURATION.match(text)
    if not m:
        raise InvalidRequest(
            f"{option} must be a duration like 30d, 12h, 90m or 3600, not {text!r}"
        )
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    return bounds.number(
        option, seconds, low=0, high=MAX_TOKEN_LIFETIME_S, low_open=True, unit="seconds"
    )


async def create(
    store: TokenStore,
    *,
    tenant: str,
    scopes: str | Sequence[str],
    name: str | None = None,
    expires_in_s: float | None = None,
    by: str,
    clock: Clock = time.time,
) -> Created:
    """A new token of `tenant` with `scopes`, lifting itself after `expires_in_s` if given."""
    bounds.text("--tenant", tenant)
    wanted = parse_scopes(scopes)
    if expires_in_s is not None:
        bounds.number(
            "--expires-in",
            expires_in_s,
            low=0,
            high=MAX_TOKEN_LIFETIME_S,
            low_open=True,
            unit="seconds",
        )
    now = clock()
    secret, token_id = new_secret(), new_id()
    token = ApiToken(
        id=token_id,
        name=name or "",
        tenant=tenant.strip(),
        scopes=wanted,
        secret_hash=hash_secret(secret),
        created_at=now,
        created_by=by,
        expires_at=None if expires_in_s is None else now + expires_in_s,
    )
    await store.create_token(token)
    return Created(token, token_text(token_id, secret))


async def list_tokens(store: TokenStore) -> list[ApiToken]:
    return await store.tokens()


async def revoke(
    store: TokenStore, token_id: str, *, by: str, clock: Clock = time.time
) -> ApiToken:
    """Revoke a token at once (NotFound, or Conflict when it is revoked already)."""
    return await store.revoke_token(token_id, at=clock(), by=by)


async def authenticate(
    store: TokenStore, presented: str, *, clock: Clock = time.time
) -> ApiToken | None:
    """The live token whose text was presented; None for anything else (malformed, unknown,
    wrong secret, expired, revoked) — the caller answers all of them alike."""
    parts = split_token(presented.strip())
    if parts is None:
        return None
    token_id, secret = parts
    try:
        token = await store.token(token_id)
    except NotFound:
        return None
    if not matches(token, secret) or not token.live_at(clock()):
        return None
    return token
