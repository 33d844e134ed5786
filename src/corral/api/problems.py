"""Errors as RFC 9457 problem details (`application/problem+json`): one table from an error's
machine code (`CorralError.code`, domain/errors.py) to an HTTP status, as cli/exits.py maps codes
to exit codes. A code the table does not name falls back to its parent class's, then to 500;
an exception that is no CorralError is a 500 with a fixed detail, never a traceback."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.domain.errors import Backpressure, CorralError

log = logging.getLogger(__name__)
MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://corral.dev/problems/"  # `type` is this plus the code (a stable name)

STATUS: Mapping[str, int] = {
    "invalid_request": 422,
    "config_invalid": 500,
    "unauthenticated": 401,
    "not_permitted": 403,
    "permit_refused": 403,
    "not_found": 404,
    "conflict": 409,
    "stale_state": 409,
    "engine_running": 409,
    "backpressure": 429,
    "store_unavailable": 503,
    "engine_fenced": 503,
    "engine_not_running": 503,
}
INTERNAL = 500
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Unauthenticated(CorralError):
    """No token, or one that is malformed, unknown, expired or revoked (all alike)."""

    code = "unauthenticated"


def documented() -> dict[int | str, dict[str, Any]]:
    """The error answers every route may give, for the OpenAPI document."""
    from corral.schemas.api import Problem

    schema = Problem.model_json_schema()
    said = {
        400: "Malformed JSON.",
        401: "No valid token.",
        403: "A scope is missing.",
        404: "No such job (or another tenant's).",
        409: "Conflicts with the state.",
        413: "The request's body is over the limit (4 MiB).",
        422: "Invalid input.",
        429: "Backpressure or the rate limit; see Retry-After.",
        500: "Internal error.",
        503: "The store or the engine is unavailable.",
    }
    return {
        status: {"description": text, "content": {MEDIA_TYPE: {"schema": schema}}}
        for status, text in said.items()
    }


def _methods(request: Request) -> set[str]:
    """The methods the app's OpenAPI document serves on the request's path."""
    found: set[str] = set()
    for template, ops in request.app.openapi()["paths"].items():
        pattern = re.sub(r"\\{[^}/]+\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            found |= {m.upper() for m in ops}
    return found


def status_of(err: CorralError) -> int:
    """The HTTP status for `err`: its class's code, else the nearest parent's that has one."""
    for cls in type(err).__mro__:
        code = vars(cls).get("code")
        if isinstance(code, str) and code in STATUS:
            return STATUS[code]
    return INTERNAL


def problem(
    status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {
        "type": TYPE_BASE + code,
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    return JSONResponse(
        body, status_code=status, media_type=MEDIA_TYPE, headers=dict(headers or {})
    )


def retry_after(seconds: float) -> str:
    """Retry-After as whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


def corral_problem(err: CorralError) -> JSONResponse:
    status = status_of(err)
    headers = (
        {"Retry-After": retry_after(err.retry_after_s)} if isinstance(err, Backpressure) else {}
    )
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return problem(status, err.code, str(err), headers=headers)


class BodyLimit:
    """ASGI middleware: a request whose body is over `limit` bytes is a 413 problem, refused by
    its Content-Length before anything is read, or, streamed without one, as soon as the bytes
    read pass the limit (raised from `receive` into the route, answered by `install`'s handler).
    Starlette's own limit answers in plain text, and replaces any answer to a request whose
    Content-Length is over it with its own."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > self.limit:
                    await self._refuse(scope, receive, send)
                    return
                await self.app(scope, receive, send)  # the server reads no more than it says
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise StarletteHTTPException(413, self._detail())
            return message

        await self.app(scope, counted, send)

    def _detail(self) -> str:
        return f"the request's body is over the {self.limit}-byte limit"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await problem(413, "content_too_large", self._detail())(scope, receive, send)


def install(app: FastAPI) -> None:
    """Answer every error of the app as a problem."""

    async def on_corral(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, CorralError)
        return corral_problem(err)

    async def on_validation(_: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, RequestValidationError)
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in err.errors()
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        return problem(
            422, "invalid_request", f"{'.'.join(first['loc'])}: {first['msg']}", errors=errors
        )

    async def on_http(request: Request, err: Exception) -> JSONResponse:
        assert isinstance(err, StarletteHTTPException)
        code = {
            400: "invalid_request",
            404: "not_found",
            405: "method_not_allowed",
            413: "content_too_large",
        }.get(err.status_code, "http_error")
        headers = dict(err.headers or {})
        if err.status_code == 405:  # every method of the path, not only the first route's
            headers["Allow"] = ", ".join(sorted(_methods(request)))
        return problem(err.status_code, code, str(err.detail), headers=headers)

    async def on_other(_: Request, err: Exception) -> JSONResponse:
        log.exception("internal error answering an API request")
        return problem(
            INTERNAL,
            "internal",
            f"internal error ({type(err).__name__}); the engine's log has the details",
        )

    app.add_exception_handler(CorralError, on_corral)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_other)
