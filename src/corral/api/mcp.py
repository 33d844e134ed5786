"""`/mcp`: Corral's MCP tools (corral/mcp/) over the streamable HTTP transport, with the HTTP
API's bearer tokens. A request without a valid token is a 401 problem (as on every route); the
token's rate limit applies; its tenant and scopes become the caller of the tools, so a missing
scope is an error result naming it and another tenant's job is "not found".

The transport runs stateless with JSON answers: every POST stands alone, so several engines on
one PostgreSQL database serve `/mcp` alike with no session to stick to. Its task group lives as
long as the app (`lifespan`: `corral serve` enters it, api/server.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from corral.domain.errors import CorralError, NotPermitted
from corral.mcp import Caller, build_server
from corral.services import tokens

from .auth import actor
from .problems import Unauthenticated, corral_problem
from .state import ApiState

PATH = "/mcp"
CALLER = "corral_mcp_caller"  # where the gate leaves the caller in the request's state


async def _caller_of(ctx: Context) -> Caller:
    request = ctx.request_context.request
    found = getattr(request.state, CALLER, None) if isinstance(request, Request) else None
    if not isinstance(found, Caller):  # never served without the gate; said plainly if so
        raise NotPermitted("no authenticated caller for this MCP request")
    return found


class McpEndpoint:
    """The ASGI endpoint of `/mcp`: bearer token first, then the MCP transport."""

    def __init__(self, st: ApiState) -> None:
        self.st = st
        self.server: MCPServer = build_server(st.store, st.config, st.wake, _caller_of)
        # Every request needs a bearer token, which a page rebinding a name to this address
        # does not have: the transport's Host/Origin allow-list (loopback names only) would
        # refuse an engine served on its real name, so it is off.
        self.server.streamable_http_app(
            streamable_http_path=PATH,
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.sessions: StreamableHTTPSessionManager = self.server.session_manager

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.sessions.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller = await self._authenticate(request)
        except CorralError as err:
            await corral_problem(err)(scope, receive, send)
            return
        scope.setdefault("state", {})[CALLER] = caller
        await self.sessions.handle_request(scope, receive, send)

    async def _authenticate(self, request: Request) -> Caller:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthenticated(
                "missing bearer token: send `Authorization: Bearer <token>` "
                "(`corral token create` makes one)"
            )
        token = await tokens.authenticate(self.st.store, presented, clock=self.st.clock)
        if token is None:
            raise Unauthenticated("invalid, expired or revoked token")
        self.st.buckets.take(token.id)
        return Caller(token.tenant, token.scopes, actor(token))
