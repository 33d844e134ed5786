"""Corral's MCP server: tools through which agents ask Corral about jobs and the fleet (and
submit jobs, when their access allows) instead of polling the CLI.

The tools (tools.py) call the application services (services/) for a `Caller` — a tenant and
its scopes. Both edges serve them: `corral mcp` over stdio (stdio.py, for the local user or a
token), and `corral serve` at `/mcp` over streamable HTTP with the HTTP API's bearer tokens
(api/mcp.py). This room sits between the edges and the services, so that both edges can import
it (docs/explanation/design.md, docs/reference/mcp.md)."""

from __future__ import annotations

from corral.mcp.tools import Caller, build_server, fixed

__all__ = ["Caller", "build_server", "fixed"]
