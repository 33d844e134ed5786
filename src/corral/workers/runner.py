"""`python -m corral.workers.runner`: runs an agent CLI under the shim, stopping it its own way.

    corral-shim --term-child-only 1 … -- python -m corral.workers.runner --graceful INT -- claude …

A stop reaches the runner alone (the shim runs it with `--term-child-only`): the runner passes
the CLI's own graceful signal to the CLI's process group (Claude Code: SIGINT, which makes it
abort the running tool, kill the tool's processes, say so in its stream and usually print its
`result`, unless its own shutdown, started at once, wins that race; the others: SIGTERM) and
keeps relaying until the CLI has exited, so the CLI's last words reach the log.
Tool processes are left to the CLI for the grace; then the shim kills whatever is left. The
runner exits with the CLI's status (128 + signal when the CLI was killed by one). Being under
the shim, it survives an engine crash like the CLI does.

The CLI writes to the runner's own stdout and stderr, the shim's pipes to its output pump
(workers/pump.py), which redacts the stream on its way to the attempt's logs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-runner", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--graceful", default="TERM", help="the signal (name without SIG) that asks the CLI to stop"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    graceful = signal.Signals[f"SIG{args.graceful.upper().removeprefix('SIG')}"]
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
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=_default_signals
        )
    except OSError as exc:
        print(f"corral-runner: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    if stop_asked:  # asked to stop while starting
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, graceful)
    code = child.wait()
    return 128 - code if code < 0 else code


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
