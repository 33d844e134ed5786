"""How Codex will run a shell call: read from its session transcript, not from the hook.

Codex's PreToolUse hook hands over only ``{"command": …}`` for an ``exec_command`` call; the
``shell`` the model named (Codex runs bash, zsh or ``/bin/sh`` — dash here — by its name), the
``tty`` that makes a session ``write_stdin`` can type into, and a sandbox escalation are left
out. Codex writes the model's call, with all its arguments, to the session transcript
(``transcript_path`` in the payload) before it runs the hook, so the engine reads them there,
by the call's id. A call it cannot find or read is refused (docs/explanation/governance.md).
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CodexCall", "codex_shell_call", "shell_dialect"]

_CHUNK = 1 << 16
_MAX_SCAN = 32 << 20  # the call was written just now: it is near the end of the transcript


@dataclass(frozen=True, slots=True)
class CodexCall:
    shell: str  # the dialect the command runs under: bash | sh | the name of another shell
    command: str


def shell_dialect(shell: str | None) -> str:
    """The dialect Codex runs a command under, from the shell the model named (None: the
    user's login shell, as Codex picks it). Codex goes by the name: `bash` is bash, `sh` and
    `dash` are /bin/sh; any other name is returned as it is (Corral models only bash and sh)."""
    if not shell:
        shell = pwd.getpwuid(os.getuid()).pw_shell or "sh"
    name = os.path.basename(shell.strip())
    stem = name.split(".", 1)[0]
    if stem == "bash":
        return "bash"
    if stem in ("sh", "dash"):
        return "sh"
    return stem or "sh"


def codex_shell_call(payload: Mapping[str, Any], home: Path) -> CodexCall | str:
    """The shell call the hook asks about, as Codex will run it; or why it cannot be told."""
    call_id = payload.get("tool_use_id")
    transcript = payload.get("transcript_path")
    if not isinstance(call_id, str) or not isinstance(transcript, str):
        return "the hook did not name the call or the session transcript"
    path = Path(os.path.realpath(transcript))
    if not path.is_relative_to(os.path.realpath(home)):
        return "the session transcript is not in this attempt's Codex home"
    item = _find(path, call_id)
    if item is None:
        return "the call is not in Codex's session transcript"
    return _read(item)


def _read(item: Mapping[str, Any]) -> CodexCall | str:
    name = item.get("name")
    if item.get("type") != "function_call" or name not in ("exec_command", "shell_command"):
        return f"Corral cannot tell how Codex runs a `{name or item.get('type')}` call"
    try:
        args = json.loads(str(item.get("arguments") or "{}"))
    except ValueError:
        return "the call's arguments are not JSON"
    if not isinstance(args, dict):
        return "the call's arguments are not a JSON object"
    command = args.get("cmd", args.get("command"))
    if not isinstance(command, str):
        return "the call has no command string"
    if args.get("tty"):
        return (
            "an interactive session (`tty`) is refused: what is typed into it later "
            "(`write_stdin`) cannot be checked"
        )
    if args.get("sandbox_permissions") not in (None, "use_default"):
        return "Corral does not let an agent lift Codex's sandbox"
    shell = args.get("shell") if name == "exec_command" else None
    return CodexCall(
        shell=shell_dialect(shell if isinstance(shell, str) else None), command=command
    )


def _find(path: Path, call_id: str) -> dict[str, Any] | None:
    """The transcript's record of the call `call_id`, read from the end."""
    needle = json.dumps(call_id).encode()
    try:
        with path.open("rb") as f:
            end = f.seek(0, os.SEEK_END)
            pos, carry = end, b""
            while pos > 0 and end - pos < _MAX_SCAN:
                step = min(_CHUNK, pos)
                pos -= step
                f.seek(pos)
                chunk = f.read(step) + carry
                lines = chunk.split(b"\n")
                carry = lines.pop(0) if pos > 0 else b""
                for line in reversed(lines):
                    if needle in line and (item := _item(line, call_id)) is not None:
                        return item
            if carry and needle in carry:
                return _item(carry, call_id)
    except OSError:
        return None
    return None


def _item(line: bytes, call_id: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    item = record.get("payload") if isinstance(record, dict) else None
    if (
        isinstance(item, dict)
        and record.get("type") == "response_item"
        and item.get("call_id") == call_id
        and item.get("type") != "function_call_output"
    ):
        return item
    return None
