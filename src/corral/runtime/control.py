"""The engine's local control socket: CLI commands poke a running engine after they write.

The store is the source of truth; a poke only says "look now" (a submission, a cancel). If no
engine listens, the poke is a no-op and the engine finds the change on its next periodic look.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketStream

MAX_LINE = 64 * 1024


def socket_path(data_dir: Path) -> Path:
    """`<data dir>/engine.sock`, or a short /tmp name when that path is too long for AF_UNIX."""
    p = data_dir / "engine.sock"
    if len(str(p)) < 100:
        return p
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"corral-{digest}.sock"


def poke(data_dir: Path, op: str = "wake", timeout: float = 0.5,
         **fields: Any) -> dict[str, Any] | None:
    """Tell a running engine to look now (or ask it something); None when none answers."""
    path = socket_path(data_dir)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n") and len(data) < MAX_LINE:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    try:
        answer: dict[str, Any] = json.loads(data)
    except ValueError:
        return None
    return answer


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve_control(data_dir: Path, handle: Handler) -> None:
    """Answer one JSON line per connection until cancelled."""
    path = socket_path(data_dir)
    path.unlink(missing_ok=True)
    listener = await anyio.create_unix_listener(path)
    try:
        await listener.serve(lambda stream: _answer(stream, handle))
    finally:
        path.unlink(missing_ok=True)


async def _answer(stream: SocketStream, handle: Handler) -> None:
    async with stream:
        data = b""
        with anyio.move_on_after(2.0):
            while not data.endswith(b"\n") and len(data) <= MAX_LINE:
                try:
                    data += await stream.receive(4096)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        try:
            request = json.loads(data)
            if not isinstance(request, dict):
                raise ValueError("not an object")
            reply = await handle(request)
        except ValueError as err:
            reply = {"ok": False, "error": f"malformed request: {err}"}
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.send(json.dumps(reply).encode() + b"\n")
