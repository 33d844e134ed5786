"""Where an agent CLI reaches Corral's model gateway, and the token it shows there.

The engine's gateway (runtime/modelgate.py) listens on 127.0.0.1 at an ephemeral port and writes
`<data dir>/model-gateway.json` (mode 0600): its URL and a random key of this engine's life. An
agent attempt whose worker names a `gateway` gets the URL as its CLI's base URL and, as its API
key, a token bound to the attempt and its permit: `cgw1.<job id>.<attempt>.<mac>`, the mac an
HMAC of the attempt and the permit id under the gateway's key. Only the gateway can check it, it
names the attempt it bills, and it stops working when the attempt ends (the gateway accepts a
token only while its attempt holds a live permit). The provider's own key stays in the engine.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from corral.domain.errors import WorkerError

GATEWAY_FILE = "model-gateway.json"
TOKEN_PREFIX = "cgw1."
TOKEN_ENV = "CORRAL_MODEL_TOKEN"  # the variable a CLI reads its gateway token from (Codex)


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str  # http://127.0.0.1:<port>
    key: bytes  # the token key of this engine's life

    def token(self, ref: str, permit_id: str) -> str:
        """The attempt's token (`ref` is `<job id>.<attempt index>`)."""
        return f"{TOKEN_PREFIX}{ref}.{_mac(self.key, ref, permit_id)}"


def new_endpoint(url: str) -> Endpoint:
    return Endpoint(url=url, key=secrets.token_bytes(32))


def publish(data_dir: Path, endpoint: Endpoint) -> None:
    """Write the endpoint for the engine's workers (the core may run in another process)."""
    path = data_dir / GATEWAY_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": endpoint.url, "key": endpoint.key.hex(), "pid": os.getpid()}, f)
    os.replace(tmp, path)


def withdraw(data_dir: Path) -> None:
    (data_dir / GATEWAY_FILE).unlink(missing_ok=True)


def read_endpoint(data_dir: Path) -> Endpoint:
    """The running engine's gateway, or WorkerError when there is none."""
    try:
        data = json.loads((data_dir / GATEWAY_FILE).read_text())
        return Endpoint(url=str(data["url"]), key=bytes.fromhex(str(data["key"])))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise WorkerError(
            "the worker's model calls go through the model gateway, but the "
            "engine's gateway is not running"
        ) from err


def parse_token(token: str) -> tuple[str, str, str] | None:
    """(job id, attempt index, mac) of a gateway token, or None when it is not one."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    ref, _, mac = token[len(TOKEN_PREFIX) :].rpartition(".")
    job_id, _, index = ref.rpartition(".")
    if not job_id or not index.isdigit() or not mac:
        return None
    return job_id, index, mac


def token_valid(key: bytes, job_id: str, index: str, mac: str, permit_id: str) -> bool:
    return hmac.compare_digest(mac, _mac(key, f"{job_id}.{index}", permit_id))


def _mac(key: bytes, ref: str, permit_id: str) -> str:
    return hmac.new(key, f"{ref}\n{permit_id}".encode(), hashlib.sha256).hexdigest()[:40]
