"""`ApiError`: an error answer of the HTTP API (RFC 9457 problem details), or no answer."""

from __future__ import annotations

from typing import Any

import httpx

from corral.domain.errors import CorralError

PROBLEM_TYPE_BASE = "https://corral.dev/problems/"


class ApiError(CorralError):
    """The API refused a request: `status` (HTTP; 0 when no answer came), `code` (the machine
    code, as `type` ends), `detail` (one line for people), `retry_after` (seconds, on 429 and
    503 when the server said) and the whole problem `body`."""

    code: str = "api_error"

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        type: str | None = None,
        retry_after: float | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.type = type or PROBLEM_TYPE_BASE + code
        self.detail = detail
        self.retry_after = retry_after
        self.body = body or {}

    def __repr__(self) -> str:
        return f"ApiError(status={self.status}, code={self.code!r}, detail={self.detail!r})"


class Unauthenticated(ApiError):
    """401: no token, or one that is malformed, unknown, expired or revoked."""

    code = "unauthenticated"


class RateLimited(ApiError):
    """429 from the token's rate limit (a queue cap's 429 is `backpressure`)."""

    code = "rate_limited"


class Unreachable(ApiError):
    """No answer at all: the server is down, the address wrong, or the connection dropped."""

    code = "unreachable"


_KINDS: dict[str, type[ApiError]] = {k.code: k for k in (Unauthenticated, RateLimited, Unreachable)}


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: not what Corral sends; unknown
        return None


def from_response(r: httpx.Response) -> ApiError:
    """The error an answer of 400 or more stands for: its problem body when it has one, else
    its status and the start of its text."""
    body: dict[str, Any] = {}
    try:
        data = r.json()
        if isinstance(data, dict):
            body = data
    except ValueError:
        pass
    code = str(body.get("code") or _code_of(r.status_code))
    detail = str(body.get("detail") or r.text[:200] or r.reason_phrase)
    return _KINDS.get(code, ApiError)(
        r.status_code,
        code,
        detail,
        type=str(body["type"]) if "type" in body else None,
        retry_after=_retry_after(r.headers.get("Retry-After")),
        body=body,
    )


def _code_of(status: int) -> str:
    return {
        401: "unauthenticated",
        403: "not_permitted",
        404: "not_found",
        409: "conflict",
        422: "invalid_request",
        429: "backpressure",
        503: "unavailable",
    }.get(status, "http_error")


def unreachable(url: str, err: Exception) -> ApiError:
    """No answer at all: the server is down, the address wrong, or the connection dropped."""
    return Unreachable(0, "unreachable", f"cannot reach the Corral API at {url}: {err}")
