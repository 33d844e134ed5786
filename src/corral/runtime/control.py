"""The engine's local control socket: CLI commands poke a running engine after they write.

The store is the source of truth; a poke only says "look now" (a submission, a cancel). If no
engine listens, the poke is a no-op and the engine finds the change on its next periodic look.

Every connection is checked (runtime/peers.py): a caller of another user is refused, and one of
the engine's jobs may only use the operations a job needs (`JOB_OPS`, `JOB_CORE_OPS`), never
an operator command relayed to the core. A request nested deeper than the JSON depth bound is
answered with an error, never parsed (domain/bounds.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from corral.domain.bounds import BoundError, loads_bounded
from corral.domain.errors import NotPermitted
from corral.runtime.peers import IsJob, Peer, Refused, admit, identify, refuse, restrict

log = logging.getLogger("corral.sockets")

MAX_LINE = 64 * 1024


def socket_path(data_dir: Path) -> Path:
    """`<data dir>/engine.sock`, or a short /tmp name when that path is too long for AF_UNIX."""
    p = data_dir / "engine.sock"
    if len(str(p)) < 100:
        return p
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"corral-{digest}.sock"


def caller_job(data_dir: Path) -> str | None:
    """The job this process belongs to in the eyes of the engine serving `data_dir` (None: the
    operator, or no engine answers)."""
    answer = poke(data_dir, "whoami")
    if answer and answer.get("capability") == "job":
        return str(answer.get("job"))
    return None


def operator_only(data_dir: Path, command: str) -> None:
    """NotPermitted when one of the engine's jobs runs an operator command (`kill-switch on`,
    `approvals approve` …): the engine, which sees who calls, says whether it is one."""
    job = caller_job(data_dir)
    if job is not None:
        raise NotPermitted(
            f"refused: `corral {command}` is an operator command; job {job} may not run it"
        )


def poke(
    data_dir: Path, op: str = "wake", timeout: float = 0.5, **fields: Any
) -> dict[str, Any] | None:
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


def tell(data_dir: Path, op: str = "wake", timeout: float = 0.5) -> bool:
    """Tell a running engine to look now without waiting for its answer (`op`: "wake" or
    "submitted"); whether an engine's socket took it. What a submission or a cancel pokes
    with: an engine that answered would wake the caller on the engine's own CPU (a unix
    socket's wake-up is synchronous), and the caller's exit would run in front of the dispatch
    the poke asked for (bench/run.py --only LAT)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(socket_path(data_dir)))
            s.sendall(json.dumps({"op": op}).encode() + b"\n")
    except OSError:
        return False
    return True


def waker(data_dir: Path) -> Callable[[str], bool | None]:
    """The services' `Wake` for an edge outside the engine: True when an engine took the poke,
    None when none did."""
    return lambda op: tell(data_dir, op) or None


Handler = Callable[[dict[str, Any], Peer], Awaitable[dict[str, Any]]]

# What one of the engine's jobs may ask: is the engine there, look now (after it submitted a
# child or cancelled), who am I (the CLI asks before an operator command), and the core's
# state. Everything else is the operator's.
JOB_OPS = frozenset({"ping", "wake", "submitted", "whoami"})
JOB_CORE_OPS = frozenset({"snapshot"})
# What is answered alike whoever asks, so the caller is not looked up: each `corral submit`
# pokes, and walking its ancestors' /proc entries cost the engine's loop ~0.8 ms, in front of
# the permit of the very job it submitted (bench/run.py --only LAT).
OPEN_OPS = frozenset({"ping", "wake", "submitted"})


def job_may(request: dict[str, Any]) -> bool:
    """Whether a job's capability covers this request."""
    op = request.get("op")
    return op in JOB_OPS or (op == "core" and request.get("core_op") in JOB_CORE_OPS)


async def _no_jobs(job: str) -> bool:
    return False


async def serve_control(
    data_dir: Path,
    handle: Handler,
    *,
    group: int | None = None,
    is_job: IsJob = _no_jobs,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer one JSON line per connection until cancelled (started: the socket listens)."""
    path = socket_path(data_dir)
    path.unlink(missing_ok=True)
    listener = await anyio.create_unix_listener(path)
    restrict(path, group)
    task_status.started()
    try:
        await listener.serve(lambda stream: _answer(stream, handle, group, is_job))
    finally:
        path.unlink(missing_ok=True)


async def _answer(stream: SocketStream, handle: Handler, group: int | None, is_job: IsJob) -> None:
    async with stream:
        try:
            peer = admit(stream.extra(SocketAttribute.raw_socket), group=group, what="engine.sock")
        except Refused as err:
            await refuse(
                stream, json.dumps({"ok": False, "error": f"refused: {err}"}).encode() + b"\n"
            )
            return
        data = b""
        with anyio.move_on_after(2.0):
            while not data.endswith(b"\n") and len(data) <= MAX_LINE:
                try:
                    data += await stream.receive(4096)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        try:
            request = loads_bounded(data)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except (ValueError, BoundError) as err:
            reply = {"ok": False, "error": f"malformed request: {err}"}
        else:
            reply = await _reply(request, peer, handle, is_job)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.send(json.dumps(reply).encode() + b"\n")


async def _reply(
    request: dict[str, Any], peer: Peer, handle: Handler, is_job: IsJob
) -> dict[str, Any]:
    if request.get("op") not in OPEN_OPS:
        try:
            peer = await identify(peer, is_job)
        except Refused as err:
            return {"ok": False, "refused": True, "error": f"refused: {err}"}
    if peer.capability == "job" and not job_may(request):
        what = request.get("core_op") if request.get("op") == "core" else request.get("op")
        log.warning("engine.sock: refused %r from %s: an operator command", what, peer.describe())
        return {
            "ok": False,
            "refused": True,
            "error": f"refused: {what!r} is an operator command; job {peer.job} may not run it",
        }
    try:
        return await handle(request, peer)
    except ValueError as err:
        return {"ok": False, "error": f"malformed request: {err}"}
