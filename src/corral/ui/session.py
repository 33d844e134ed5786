"""The dashboard's session: an API token presented once at login is exchanged for a signed
cookie that names the token (never its secret) and a random session id; every request looks the
token up again in the store, so a revoked or expired token ends its sessions at once, on every
engine.

The session state is the store's (the token) and the cookie's (signed); nothing is kept per
engine. The signing key is derived from the secrets key (`secrets.key_file`), which the engines
sharing a PostgreSQL store must share already to open each other's sealed secrets: so a session
begun on one engine, the sign-in form one engine served and the CSRF token of a form are good
on every engine of the store (behind a load balancer), and a restart signs no one out. The key
itself is never written: it is computed from the secrets key at start. Each mutating form
carries a CSRF token derived from the session id with the same key (a second, independent
check beside SameSite=Strict)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

COOKIE = "corral_session"
LOGIN_COOKIE = "corral_login"  # the sign-in form's nonce, until a session replaces it
LIFETIME_S = 12 * 3600.0  # a session lasts at most this long (the token's own expiry still holds)


def shared_key(secrets_key: bytes) -> bytes:
    """The dashboard's signing key: the same on every engine that has the same secrets key, and
    of no use for anything else (a one-way derivation with its own label)."""
    return hmac.new(secrets_key, b"corral dashboard sessions v1", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Session:
    token_id: str
    sid: str  # random, one per login
    expires_at: float


class Signer:
    """Signs and checks session cookies and CSRF tokens with one secret key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _mac(self, purpose: str, payload: bytes) -> str:
        return _b64(
            hmac.new(self._key, purpose.encode() + b"\0" + payload, hashlib.sha256).digest()
        )

    def new(self, token_id: str, now: float) -> tuple[Session, str]:
        """A new session of `token_id` and its cookie value."""
        s = Session(token_id, _b64(secrets.token_bytes(18)), now + LIFETIME_S)
        payload = json.dumps({"t": s.token_id, "s": s.sid, "e": s.expires_at}).encode()
        return s, _b64(payload) + "." + self._mac("session", payload)

    def read(self, value: str | None, now: float) -> Session | None:
        """The session a cookie value holds when its signature is ours and it has not expired."""
        if not value or value.count(".") != 1:
            return None
        body, mac = value.split(".")
        try:
            payload = _unb64(body)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac("session", payload)):
            return None
        try:
            data = json.loads(payload)
            s = Session(str(data["t"]), str(data["s"]), float(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        return s if now < s.expires_at else None

    def csrf(self, session: Session) -> str:
        """The CSRF token of a session: forms post it back as `csrf`."""
        return self._mac("csrf", session.sid.encode())

    def csrf_ok(self, session: Session, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(str(presented), self.csrf(session))

    def login_nonce(self) -> tuple[str, str]:
        """A fresh sign-in nonce (its cookie value) and the CSRF token its form posts back:
        before a session exists, the sign-in form is bound to the browser that loaded it."""
        nonce = _b64(secrets.token_bytes(18))
        return nonce, self._mac("login", nonce.encode())

    def login_ok(self, nonce: str | None, presented: str | None) -> bool:
        if not nonce or not presented:
            return False
        return hmac.compare_digest(str(presented), self._mac("login", nonce.encode()))
