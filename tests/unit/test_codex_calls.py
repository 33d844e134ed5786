"""Codex's hook leaves out how a shell call will run; the engine reads it from the session
transcript Codex wrote before it ran the hook (records shaped as Codex 0.169.0 writes them)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from corral.workers.agents.codex import CodexWorker
from corral.workers.codexcalls import CodexCall, codex_shell_call, shell_dialect


def record(call_id: str, arguments: dict[str, Any], name: str = "exec_command") -> str:
    return json.dumps(
        {
            "timestamp": "2026-11-23T22:35:25.696Z",
            "type": "response_item",
            "payload": {
                "type": "function_call",
                "status": "completed",
                "id": "fc_1",
                "name": name,
                "arguments": json.dumps(arguments),
                "call_id": call_id,
            },
        }
    )


def output(call_id: str) -> str:
    return json.dumps(
        {
            "type": "response_item",
            "payload": {"type": "function_call_output", "call_id": call_id, "output": "ok"},
        }
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "codex-home" / "sessions").mkdir(parents=True)
    return tmp_path / "codex-home"


def transcript(home: Path, lines: list[str]) -> Path:
    path = home / "sessions" / "rollout.jsonl"
    meta = json.dumps({"type": "session_meta", "payload": {"cwd": "/w", "x": "y" * 100_000}})
    path.write_text("\n".join([meta, *lines]) + "\n")
    return path


def payload(path: Path, call_id: str, command: str) -> dict[str, Any]:
    return {
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": command},
        "tool_use_id": call_id,
        "transcript_path": str(path),
    }


LOGIN_SHELL = shell_dialect(pwd.getpwuid(os.getuid()).pw_shell)


@pytest.mark.parametrize(
    ("arguments", "found"),
    [
        ({"cmd": "ls"}, CodexCall(LOGIN_SHELL, "ls")),
        ({"cmd": "ls", "shell": "/bin/sh"}, CodexCall("sh", "ls")),
        ({"cmd": "ls", "shell": "dash"}, CodexCall("sh", "ls")),
        ({"cmd": "ls", "shell": "/usr/bin/bash", "login": False}, CodexCall("bash", "ls")),
        ({"cmd": "ls", "shell": "zsh"}, CodexCall("zsh", "ls")),
        ({"cmd": "ls", "shell": "/usr/bin/python3"}, CodexCall("python3", "ls")),
        ({"cmd": "ls", "workdir": "sub", "yield_time_ms": 500}, CodexCall(LOGIN_SHELL, "ls")),
        ({"cmd": "sh", "tty": True}, "`tty`"),
        ({"cmd": "ls", "sandbox_permissions": "require_escalated"}, "sandbox"),
        ({"command": "ls"}, CodexCall(LOGIN_SHELL, "ls")),
    ],
)
def test_the_call_is_read_from_the_transcript(
    home: Path, arguments: dict[str, Any], found: CodexCall | str
) -> None:
    path = transcript(
        home,
        [
            record("call_a", {"cmd": "other"}),
            output("call_a"),
            record("call_b", arguments),
            "{not json",
        ],
    )
    got = codex_shell_call(payload(path, "call_b", "ls"), home)
    if isinstance(found, str):
        assert isinstance(got, str) and found in got
    else:
        assert got == found


def test_what_cannot_be_read_is_refused(home: Path, tmp_path: Path) -> None:
    path = transcript(home, [record("call_a", {"cmd": "ls"})])
    assert "not in Codex's session transcript" in str(
        codex_shell_call(payload(path, "call_zzz", "ls"), home)
    )
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(record("call_a", {"cmd": "ls"}) + "\n")
    assert "not in this attempt's Codex home" in str(
        codex_shell_call(payload(elsewhere, "call_a", "ls"), home)
    )
    assert "did not name" in str(codex_shell_call({"tool_input": {"command": "ls"}}, home))
    other = transcript(home, [record("call_s", {"command": ["bash", "-lc", "ls"]}, "shell")])
    assert "cannot tell how Codex runs" in str(
        codex_shell_call(payload(other, "call_s", "ls"), home)
    )


def test_the_adapter_names_the_shell_or_the_problem(home: Path) -> None:
    path = transcript(
        home, [record("call_d", {"cmd": "ls &>/dev/null touch M", "shell": "/bin/sh"})]
    )
    assert CodexWorker.call_shell(payload(path, "call_d", "ls &>/dev/null touch M"), home) == (
        "sh",
        None,
    )
    _shell, problem = CodexWorker.call_shell(payload(path, "call_d", "ls"), home)
    assert problem is not None and "not the one Codex will run" in problem


def test_a_long_transcript_is_read_from_its_end(home: Path) -> None:
    lines = [record(f"call_{i}", {"cmd": f"echo {i}"}) for i in range(3000)]
    path = transcript(home, lines)
    assert codex_shell_call(payload(path, "call_2999", "echo 2999"), home) == CodexCall(
        LOGIN_SHELL, "echo 2999"
    )
    assert codex_shell_call(payload(path, "call_7", "echo 7"), home) == CodexCall(
        LOGIN_SHELL, "echo 7"
    )


def test_the_roles_mcp_servers_are_required_and_held_to_the_tools_named() -> None:
    """Codex waits for every MCP server of the role before its first turn (a server slow to
    start would otherwise miss that turn), and finds only the tools the scope names."""
    from corral.policy.scopes import Scope
    from corral.workers.agents.codex import _codex_mcp

    servers = {
        "corral": {"type": "stdio", "command": "corral", "args": ["mcp"]},
        "docs": {"type": "http", "url": "https://docs.example/mcp", "headers": {"X": "y"}},
    }
    out = _codex_mcp(servers, Scope.parse(("mcp__corral__list_jobs", "mcp__docs")))
    assert out["corral"] == {
        "command": "corral",
        "args": ["mcp"],
        "env": {},
        "enabled_tools": ["list_jobs"],
        "default_tools_approval_mode": "approve",
        "required": True,
        "startup_timeout_sec": 60,
    }
    assert out["docs"] == {
        "url": "https://docs.example/mcp",
        "http_headers": {"X": "y"},
        "default_tools_approval_mode": "approve",
        "required": True,
        "startup_timeout_sec": 60,
    }
