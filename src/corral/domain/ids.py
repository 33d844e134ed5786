"""Time-ordered ids: 48-bit milliseconds + 80 random bits, in lowercase Crockford base32."""

from __future__ import annotations

import base64
import os
import time

# RFC 4648 base32 digits, in value order, onto Crockford's (also in ASCII order): ids made in
# a later millisecond sort after earlier ones as plain strings.
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",
                             b"0123456789abcdefghjkmnpqrstvwxyz")


def new_id(now_ms: int | None = None) -> str:
    """A 26-character id that sorts by creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    raw = (ms & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + os.urandom(10)
    return base64.b32encode(raw)[:26].translate(_CROCKFORD).decode()
