"""The HTTP API: the CLI's thin twin over the application services (services/), beside cli/.

A route authenticates its caller (api/auth.py: a bearer token → tenant and scopes), calls one
service with plain arguments and `by="token:<id>"`, and answers with the JSON shapes of
corral/schemas; every CorralError becomes an RFC 9457 problem with the status api/problems.py
maps its code to. `create_app` builds the app; `corral serve` runs it inside the engine
(docs/reference/http-api.md)."""

from __future__ import annotations

from corral.api.app import create_app

__all__ = ["create_app"]
