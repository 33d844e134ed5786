"""A deeply nested JSON line: it once killed `corral core` and
the engine (the parser's recursion limit). Sent to the core's protocol and to the engine's
control socket, it gets an error answer; the core and the engine answer the next message, and
the engine runs a new job."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from corral.runtime.control import poke, socket_path
from tests.acceptance.conftest import Corral
from tests.acceptance.corewire import CoreProcess
from tests.acceptance.corewire import job as _job
from tests.acceptance.invariants import RAN, invariants

DEPTH = 30_000  # 60 kB: within both line limits (1 MB for the core, 64 kB for the socket)
DEEP_OBJECT = b'{"type": "heartbeat", "pad": ' + b"[" * DEPTH + b"]" * DEPTH + b"}\n"
DEEP_ARRAY = b"[" * DEPTH + b"]" * DEPTH + b"\n"


def test_the_core_answers_a_deeply_nested_line_with_an_error_and_keeps_serving(
    corral: Corral, tmp_path: Path
) -> None:
    core = CoreProcess(corral)
    try:
        assert core.recv()["type"] == "hello"
        for line in (DEEP_OBJECT, DEEP_ARRAY):
            core.send_raw(line)
            reply = core.recv()
            assert reply["type"] == "error", reply
        beat = core.ask({"type": "heartbeat", "seq": 1})
        assert beat["type"] == "heartbeat" and (beat["inflight"], beat["permits"]) == (0, 0)
        j = _job("j-deep", str(tmp_path), ["true"])
        assert core.ask({"type": "request_permit", "job": j, "attempt": 1})["type"] == "permit"
    finally:
        assert core.close() == 0


def _raw(data_dir: Path, line: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(socket_path(data_dir)))
        s.sendall(line)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def test_the_engine_socket_answers_a_deeply_nested_line_and_keeps_running(
    corral: Corral, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    running = corral.submit("sh", "-c", RAN + "sleep 1", opts=("--setenv", f"RUNS={runs}"))
    engine = corral.serve()
    for line in (DEEP_OBJECT.replace(b'"type": "heartbeat"', b'"op": "ping"'), DEEP_ARRAY):
        answer = json.loads(_raw(corral.data, line))
        assert answer["ok"] is False and answer["error"], answer
        assert engine.poll() is None, corral.engine_log()[-3000:]
        assert poke(corral.data, "ping"), "the engine answers the next request"
    assert corral.wait(running) == 0
    invariants(corral, runs)
