"""The output pump: what a job prints reaches its logs redacted, and never more than a cap.

corral-shim starts it when the job first writes (a job that prints nothing costs no pump):

    fd 3, 4  the read ends of the job's stdout and stderr pipes
    fd 1, 2  the attempt's stdout.log and stderr.log
    fd 5     the secret values, NUL-separated (a memfd), with --secrets-fd 5

Each stream passes through a `StreamRedactor` (policy/redact.py), which holds back at most an
unfinished line, so a secret split across two writes is still caught. Once the job has written
more than `--max-bytes` (both streams together), the pump tells the shim (SIGUSR1), which stops
the job as for a deadline (`limit_hit = output`); from then on the pump keeps reading, so the job
never blocks on a full pipe, but keeps only the last `--tail-bytes` of each stream, written after
a marker line when the streams end. Under the shim, in the shim's session, it outlives an engine
crash like the job does (docs/how-to/secrets.md).
"""

from __future__ import annotations

import os
import select
import signal
from collections import deque

from corral.policy.redact import Redactor, StreamRedactor

# Started for every attempt that prints: only modules the interpreter has anyway, RE2 and the
# redactor (no argparse, dataclasses, json: they would double the start-up time).
CHUNK = 1 << 16


class _Stream:
    __slots__ = ("dst", "omitted", "redactor", "src", "tail", "tail_size")

    def __init__(self, *, src: int, dst: int, redactor: StreamRedactor) -> None:
        self.src = src
        self.dst = dst
        self.redactor = redactor
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.omitted = 0  # redacted bytes dropped between the head and the tail

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.dst, view)
            except InterruptedError:
                continue
            except OSError:  # the log is gone or the disk full: drop it, never block the job
                return
            view = view[n:]

    def keep(self, data: bytes, limit: int) -> None:
        """Past the cap: remember only the last `limit` bytes."""
        self.tail.append(data)
        self.tail_size += len(data)
        while self.tail_size > limit:
            extra = self.tail_size - limit
            first = self.tail[0]
            if len(first) <= extra:
                self.tail.popleft()
                self.omitted += len(first)
                self.tail_size -= len(first)
            else:
                self.tail[0] = first[extra:]
                self.omitted += extra
                self.tail_size -= extra


class Pump:
    """Copies the job's two pipes to the two logs, redacted, within the cap."""

    def __init__(self, redactor: Redactor, *, max_bytes: int, tail_bytes: int, notify: int) -> None:
        self.streams = {
            fd: _Stream(src=fd, dst=dst, redactor=redactor.stream()) for fd, dst in ((3, 1), (4, 2))
        }
        self.max_bytes = max_bytes
        self.tail_bytes = tail_bytes
        self.notify = notify  # the shim's pid
        self.total = 0
        self.capped = False

    def run(self) -> None:
        poller = select.poll()
        for fd in self.streams:
            poller.register(fd, select.POLLIN)
        open_fds = set(self.streams)
        while open_fds:
            for fd, _events in poller.poll():
                data = _read(fd)
                if data:
                    self.take(self.streams[fd], data)
                    continue
                poller.unregister(fd)
                open_fds.discard(fd)
                self.finish(self.streams[fd])

    def take(self, s: _Stream, data: bytes) -> None:
        self.total += len(data)
        if not self.capped and self.total > self.max_bytes:
            self.capped = True
            if os.getppid() == self.notify:  # never signal whoever inherited us
                os.kill(self.notify, signal.SIGUSR1)
        out = s.redactor.feed(data)
        if self.capped:
            s.keep(out, self.tail_bytes)
        else:
            s.write(out)

    def finish(self, s: _Stream) -> None:
        out = s.redactor.close()
        if not self.capped:
            s.write(out)
            return
        s.keep(out, self.tail_bytes)
        if s.omitted:
            s.write(
                f"\n[corral: output cap of {self.max_bytes} bytes reached: {s.omitted} "
                f"bytes left out; the last {s.tail_size} follow]\n".encode()
            )
        s.write(b"".join(s.tail))


def _read(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, CHUNK)
        except InterruptedError:
            continue
        except OSError:
            return b""


def _secrets(fd: int | None) -> list[str]:
    if fd is None:
        return []
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    return [v.decode("utf-8", "surrogateescape") for v in data.split(b"\0") if v]


def _options(argv: list[str]) -> dict[str, int]:
    """`--max-bytes N --tail-bytes N [--secrets-fd N]`, all required but the last."""
    names = {"--max-bytes": "max_bytes", "--tail-bytes": "tail_bytes", "--secrets-fd": "secrets_fd"}
    if len(argv) % 2 or any(k not in names for k in argv[::2]):
        raise ValueError(
            f"usage: corral-pump --max-bytes N --tail-bytes N [--secrets-fd N], "
            f"not {' '.join(argv)}"
        )
    found = {names[k]: int(v) for k, v in zip(argv[::2], argv[1::2], strict=True)}
    if "max_bytes" not in found or "tail_bytes" not in found:
        raise ValueError("corral-pump: --max-bytes and --tail-bytes are required")
    return found


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        opts = _options(argv)
        secrets = _secrets(opts.get("secrets_fd"))
    except (OSError, ValueError) as err:  # redact what we cannot know? never: stop the job
        os.write(2, f"corral-pump: {err}\n".encode())
        return 70
    pump = Pump(
        Redactor(secrets),
        max_bytes=opts["max_bytes"],
        tail_bytes=opts["tail_bytes"],
        notify=os.getppid(),
    )
    pump.run()
    return 0
