"""`corral mcp`: the MCP server over stdio for one caller, as an agent CLI starts it from a
role's `mcp_config`. The caller is the local user — the default tenant, reading and submitting
(reading only with `read_only`) — or the tenant and scopes of a token (`CORRAL_TOKEN`). stdout
carries the protocol only; notes go to stderr."""

from __future__ import annotations

import logging
import os
import sys
import time

from corral.config import Config
from corral.core.ports import TokenStore
from corral.domain.errors import NotPermitted
from corral.runtime.assembly import build_store
from corral.runtime.control import waker
from corral.services import tokens

from .tools import READ, WRITE, Caller, CallerOf, build_server, fixed

LOCAL_TENANT = "default"


async def caller_for(
    store: TokenStore,
    token: str | None,
    *,
    read_only: bool,
    parent_job: str | None,
) -> CallerOf:
    """The caller of this process: the local user's, or a token's tenant and scopes — the token
    checked now (a bad one ends the command) and again at every call, so that revoking it or
    its expiry takes effect in a running server too."""
    if not token:
        scopes = (READ,) if read_only else (READ, WRITE)
        user = f"user:{os.environ.get('USER', 'local')}"
        return fixed(Caller(LOCAL_TENANT, scopes, user, parent_job))

    async def by_token(_: object = None) -> Caller:
        found = await tokens.authenticate(store, token, clock=time.time)
        if found is None:
            raise NotPermitted(
                "the token given (--token or CORRAL_TOKEN) is invalid, expired or revoked"
            )
        scopes = found.scopes
        if read_only:  # the token's reading, and nothing more
            scopes = (READ,) if found.allows(READ) else ()
        return Caller(found.tenant, scopes, f"token:{found.id}", parent_job)

    await by_token()
    return by_token


async def serve_stdio(
    config: Config, *, token: str | None, read_only: bool, parent_job: str | None
) -> None:
    """Open the store and answer MCP over stdin/stdout until the client closes them."""
    # warnings and errors only, on stderr (the SDK would install its own handler otherwise)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="corral mcp: %(levelname)s %(message)s"
    )
    store = build_store(config)
    await store.open()
    try:
        who = await caller_for(store, token, read_only=read_only, parent_job=parent_job)
        server = build_server(store, config, waker(config.data_dir), who)
        await server.run_stdio_async()
    finally:
        await store.close()
