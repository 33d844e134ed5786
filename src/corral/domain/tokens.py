"""API tokens: who may call the HTTP API (src/corral/api/), for which tenant, with which scopes.

A token is shown once when it is created (`corral token create`, docs/reference/http-api.md);
the store keeps only the sha256 of its secret part, so a stolen database grants nothing. The
token's text is `crl_<id>_<secret>`: the id finds the row, the secret is checked against its hash
in constant time (`secrets.compare_digest`)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from corral.domain.errors import InvalidRequest

# What a token may do. `admin` implies every other scope; `metrics` reads the fleet's figures
# (aggregates over every tenant, never a job id) and nothing else: a scraper's token.
SCOPES: tuple[str, ...] = ("jobs:read", "jobs:write", "approve", "govern", "metrics", "admin")
ADMIN = "admin"
PREFIX = "crl_"
SECRET_BYTES = 32  # 256 bits of randomness: a sha256 of it cannot be reversed or guessed


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiToken:
    """A token's record (never its secret)."""

    id: str
    name: str
    tenant: str
    scopes: tuple[str, ...]
    secret_hash: str  # hex sha256 of the secret part
    created_at: float
    created_by: str
    expires_at: float | None = None
    revoked_at: float | None = None
    revoked_by: str | None = None

    def allows(self, scope: str) -> bool:
        """Whether the token carries `scope` (or `admin`, which implies every scope)."""
        return scope in self.scopes or ADMIN in self.scopes

    def live_at(self, now: float) -> bool:
        """Neither revoked nor expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenEvent:
    """A token's creation or revocation as the audit chain records it: who, when, for which
    tenant and scopes — never the token's text nor its hash."""

    token_id: str
    action: str  # CREATED | REVOKED
    tenant: str
    scopes: tuple[str, ...]
    name: str
    at: float
    actor: str
    expires_at: float | None = None


CREATED, REVOKED = "created", "revoked"


def parse_scopes(text: str | Iterable[str]) -> tuple[str, ...]:
    """Scopes from `jobs:read,approve` (or a list), known ones only, each once, in SCOPES order."""
    given = [s.strip() for s in (text.split(",") if isinstance(text, str) else text)]
    given = [s for s in given if s]
    unknown = sorted(set(given) - set(SCOPES))
    if unknown:
        raise InvalidRequest(
            f"unknown scope(s) {', '.join(unknown)}: scopes are {', '.join(SCOPES)}"
        )
    if not given:
        raise InvalidRequest(f"a token needs at least one scope of {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in given)


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_text(token_id: str, secret: str) -> str:
    """What the holder presents as `Authorization: Bearer …`."""
    return f"{PREFIX}{token_id}_{secret}"


def split_token(text: str) -> tuple[str, str] | None:
    """(id, secret) of a presented token; None when it is not shaped like one."""
    if not text.startswith(PREFIX):
        return None
    token_id, sep, secret = text[len(PREFIX) :].partition("_")
    if not sep or not token_id or not secret:
        return None
    return token_id, secret


def matches(token: ApiToken, secret: str) -> bool:
    """Whether `secret` is the token's, in time independent of where they differ."""
    return secrets.compare_digest(hash_secret(secret), token.secret_hash)
