"""`/api/v1/tokens` (`admin`): create a token (its text in the answer, this once), list them
(never a secret nor a hash), revoke one — as `corral token create|list|revoke` do
(services/tokens.py), recorded on the audit chain as done by `token:<id>`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from corral.schemas import api as bodies
from corral.schemas import views
from corral.services import tokens

from .auth import Admin, actor
from .state import state_of

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])
TokenId = Annotated[str, Path(min_length=1, max_length=100)]


@router.post("", status_code=201, response_model=views.TokenCreated)
async def create_token(body: bodies.TokenCreate, request: Request, token: Admin) -> Any:
    """A new token for `tenant` (default: the caller's) with `scopes`; the answer carries its
    text, shown this once: only its hash is kept."""
    st = state_of(request)
    made = await tokens.create(
        st.store,
        tenant=body.tenant or token.tenant,
        scopes=body.scopes,
        name=body.name,
        expires_in_s=body.expires_in_s,
        by=actor(token),
        clock=st.clock,
    )
    return views.TokenCreated.created(made.token, made.text).dump()


@router.get("", response_model=list[views.Token])
async def list_tokens(request: Request, token: Admin) -> Any:
    """Every token, revoked ones too, oldest first (never a secret nor a hash)."""
    return [views.Token.of(t).dump() for t in await tokens.list_tokens(state_of(request).store)]


@router.post("/{token_id}/revoke", response_model=views.Token)
async def revoke_token(token_id: TokenId, request: Request, token: Admin) -> Any:
    """Revoke a token at once (409 when it is revoked already)."""
    st = state_of(request)
    revoked = await tokens.revoke(st.store, token_id, by=actor(token), clock=st.clock)
    return views.Token.of(revoked).dump()
