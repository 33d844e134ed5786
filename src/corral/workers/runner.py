"""`python -m corral.workers.runner`: runs an agent CLI under the shim, redacting what it prints.

    corral-shim --term-child-only 1 … -- python -m corral.workers.runner --graceful INT -- claude …

The runner sits between the shim and the CLI so that secrets never reach the attempt's logs: the
CLI's stdout (its event stream) and stderr pass through the redactor line by line before they are
written to the runner's own stdout and stderr, which the shim has opened on the log files. The
secret values come from the environment: `CORRAL_REDACT_ENV` names the variables whose values are
secret (the runner keeps them in the CLI's environment; the CLI needs its API key).

A stop reaches the runner alone (the shim runs it with `--term-child-only`): the runner passes
the CLI's own graceful signal to the CLI's process group (Claude Code: SIGINT, which makes it
abort the running tool, kill the tool's processes and still print its `result`; the others:
SIGTERM) and keeps relaying until the CLI has exited, so the CLI's last words reach the log.
Tool processes are left to the CLI for the grace; then the shim kills whatever is left. The
runner exits with the CLI's status (128 + signal when the CLI was killed by one). Being under
the shim, it survives an engine crash like the CLI does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import BinaryIO

from corral.policy.redact import Redactor

MAX_LINE = 8 << 20
PIPE_DRAIN_S = 2.0  # a longer line is redacted and written in pieces of this size


def _pump(src: BinaryIO, dst: BinaryIO, redactor: Redactor) -> None:
    while True:
        line = src.readline(MAX_LINE)
        if not line:
            return
        text = line.decode("utf-8", errors="replace")
        try:
            dst.write(redactor.text(text).encode())
            dst.flush()
        except OSError:  # the log file is gone (disk full…): keep draining so the CLI never blocks
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-runner", description=__doc__.split("\n")[0])
    parser.add_argument("--graceful", default="TERM",
                        help="the signal (name without SIG) that asks the CLI to stop")
    parser.add_argument("--redact-file", type=Path,
                        help="a JSON list of more secret values; read, then deleted")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    graceful = signal.Signals[f"SIG{args.graceful.upper().removeprefix('SIG')}"]
    names = [n for n in os.environ.get("CORRAL_REDACT_ENV", "").split(",") if n]
    values = [os.environ[n] for n in names if n in os.environ]
    if args.redact_file is not None:
        try:
            values += [v for v in json.loads(args.redact_file.read_text()) if isinstance(v, str)]
            args.redact_file.unlink()
        except (OSError, ValueError) as err:  # redact what we can: never run unredacted quietly
            print(f"corral-runner: cannot read {args.redact_file}: {err}", file=sys.stderr)
            return 70
    redactor = Redactor(values)
    child: subprocess.Popen[bytes] | None = None
    stop_asked = False

    def forward(_sig: int, _frame: object) -> None:
        nonlocal stop_asked
        if stop_asked:  # once: a second interrupt would make some CLIs quit without a word
            return
        stop_asked = True
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, graceful)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        # Its own process group: the graceful signal reaches the CLI and its launcher children
        # (Codex and OpenCode start through a Node launcher), not the runner, not the tools.
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, process_group=0,
                                 preexec_fn=_default_signals)
    except OSError as exc:
        print(f"corral-runner: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    if stop_asked:  # asked to stop while starting
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, graceful)
    assert child.stdout is not None and child.stderr is not None
    pumps = [threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, redactor),
                              daemon=True),
             threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, redactor),
                              daemon=True)]
    for t in pumps:
        t.start()
    code = child.wait()
    for t in pumps:  # a detached tool process may hold the pipes open: do not wait for it
        t.join(timeout=PIPE_DRAIN_S)
    return 128 - code if code < 0 else code


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
