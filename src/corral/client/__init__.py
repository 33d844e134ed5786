"""A Python client of Corral's HTTP API (docs/reference/http-api.md): `AsyncClient(url, token)`
over httpx and `Client`, a thin blocking wrapper over the same code. Answers are the schemas
the API publishes (schemas/api.py, schemas/views.py); every error answer (problem+json) is
one exception, `ApiError`, with its status, machine code, detail and Retry-After.

It talks HTTP only: no store, no engine, no configuration of this machine."""

from __future__ import annotations

from .errors import ApiError, RateLimited, Unauthenticated, Unreachable
from .http import AsyncClient
from .sync import Client

__all__ = ["ApiError", "AsyncClient", "Client", "RateLimited", "Unauthenticated", "Unreachable"]
