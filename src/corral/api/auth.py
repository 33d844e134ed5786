"""Who calls: `Authorization: Bearer <token>` → the token (its id, tenant and scopes), checked by
services/tokens.py; then the token's rate limit (api/ratelimit.py) and the scope the route
needs (`admin` implies every scope). Missing or bad token: 401; missing scope: 403."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from corral.domain.errors import NotPermitted
from corral.domain.tokens import ApiToken
from corral.services import tokens

from .problems import Unauthenticated
from .state import state_of

bearer = HTTPBearer(auto_error=False, description="A token from `corral token create`.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def actor(token: ApiToken) -> str:
    """How a token's acts are attributed in timelines and governance records."""
    return f"token:{token.id}"


async def _authenticated(request: Request, credentials: Credentials) -> ApiToken:
    if credentials is None:
        raise Unauthenticated(
            "missing bearer token: send `Authorization: Bearer <token>` "
            "(`corral token create` makes one)"
        )
    st = state_of(request)
    token = await tokens.authenticate(st.store, credentials.credentials, clock=st.clock)
    if token is None:
        raise Unauthenticated("invalid, expired or revoked token")
    st.buckets.take(token.id)
    return token


def scope(needed: str) -> Callable[..., Awaitable[ApiToken]]:
    """A dependency: the caller's token when it carries `needed`; 401/403/429 otherwise."""

    async def check(request: Request, credentials: Credentials) -> ApiToken:
        # one dependency, not one on another: FastAPI's solving of each level cost about as
        # much as reading the token from the store (bench/api.py)
        token = await _authenticated(request, credentials)
        if not token.allows(needed):
            raise NotPermitted(
                f"this token lacks the scope {needed!r} (it has {', '.join(token.scopes)})"
            )
        return token

    return check


JobsRead = Annotated[ApiToken, Depends(scope("jobs:read"))]
JobsWrite = Annotated[ApiToken, Depends(scope("jobs:write"))]
Approve = Annotated[ApiToken, Depends(scope("approve"))]
Govern = Annotated[ApiToken, Depends(scope("govern"))]
Metrics = Annotated[ApiToken, Depends(scope("metrics"))]
Admin = Annotated[ApiToken, Depends(scope("admin"))]
