"""Codex CLI and OpenCode under Corral's governance, each the real pinned CLI against a loopback
mock of the OpenAI Responses API: the same hook mechanism decides every tool call (Codex through
its hooks.json, OpenCode through a plugin), and the same trace comes out."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents import (
    ROOT,
    bash,
    mcp_role,
    mcp_script,
    run_tracker,
)
from tests.agentmock import OpenAIResponsesMock, tool_names

BIN = ROOT / "tests" / "agent-clis" / "node_modules" / ".bin"


def codex_worker(mock_url: str) -> str:
    """The `codex` worker of a configuration's `workers:`, its model the mock at `mock_url`."""
    return f"""
  codex:
    binary: {BIN / "codex"}
    version: 0.169.0
    model: gpt-5.5
    summary_grace_s: 1
    env: {{MOCK_OPENAI_API_KEY: sk-mock-0123456789abcdef}}
    config:
      model_provider: mock
      model_providers:
        mock: {{name: mock, base_url: "{mock_url}/v1", env_key: MOCK_OPENAI_API_KEY,
               wire_api: responses}}
"""


def config(kind: str, mock_url: str, extra_role: str = "") -> str:
    if kind == "codex":
        worker = codex_worker(mock_url)
    else:
        worker = f"""
  opencode:
    binary: {BIN / "opencode"}
    version: 1.18.33
    model: openai/gpt-5
    summary_grace_s: 1
    config:
      provider:
        openai: {{options: {{baseURL: "{mock_url}/v1", apiKey: sk-mock-0123456789abcdef}}}}
      permission: {{bash: allow, edit: allow}}
"""
    return f"""
scheduler:
  poll_interval_s: 0.2
roles:
  default: {{}}
  agent:
    worker: {kind}
    tools: ["Bash(ls *)", "Bash(touch *)", "Bash(echo *)", "Read"]
    limits: {{max_attempts: 1, timeout_s: 90, grace_s: 2}}
  looper:
    worker: {kind}
    tools: ["Bash(echo *)", "Write(./**)"]  # `echo step >> steps.txt` writes a file
    max_turns: 2
    limits: {{max_attempts: 1, timeout_s: 90, grace_s: 2}}
{extra_role}workers:{worker}"""


@pytest.fixture(params=["codex", "opencode"])
def other(
    request: pytest.FixtureRequest, tmp_path: Path, clis: None
) -> Iterator[tuple[str, Corral, OpenAIResponsesMock]]:
    kind = str(request.param)
    mock = OpenAIResponsesMock([], dialect=kind)
    mock.start()
    c = Corral(tmp_path, config(kind, mock.url))
    try:
        yield kind, c, mock
    finally:
        c.stop_all()
        mock.close()


def test_tool_calls_are_governed_and_traced(other: tuple[str, Corral, OpenAIResponsesMock]) -> None:
    kind, c, mock = other
    (c.work / "keep.txt").write_text("precious")
    mock.script[:] = [
        {"text": "Looking.", "tool_calls": [bash("touch made.txt")]},
        {"tool_calls": [bash("rm -f keep.txt")]},
        {"text": "Summary: made a file; deleting was refused."},
    ]
    c.serve()
    job = c.ok("submit", "--role", "agent", "--prompt", "tidy up", "--cwd", str(c.work)).strip()
    c.wait(job, timeout=120)
    info = c.job(job)
    assert info["state"] == "SUCCEEDED", (info, c.engine_log()[-2000:])
    assert (c.work / "made.txt").exists()
    assert (c.work / "keep.txt").read_text() == "precious"  # denied before it ran
    t: dict[str, Any] = c.json("trace", job)
    [event] = t["agent_events"]
    assert event["worker"] == kind and event["cli_version"] in ("0.169.0", "1.18.33")
    assert event["session_id"]
    assert [(e["stage"], e["verdict"], e["reason"]) for e in t["policy_evaluations"]] == [
        ("pre_run", "allow", "allowed"),
        ("pre_run", "allow", "allowed"),  # submit, dispatch
        ("tool_call", "allow", "allowed"),
        ("tool_call", "deny", "out_of_scope"),
    ]
    by_denied = {x["denied"]: x for x in event["tool_calls"]}
    assert "rm -f keep.txt" in json.dumps(by_denied[True]["input"])
    assert "outside" in by_denied[True]["reason"]
    assert event["tokens_in"] > 0 and event["cost_usd"] is not None
    # the model was told why
    assert "outside this role's scope" in json.dumps(mock.turn_requests[-1])
    if kind == "opencode":  # tools the scope cannot allow are not even offered
        assert tool_names(mock.turn_requests[0]) == {"bash", "read"}


def test_resume_from_continues_the_cli_session(
    other: tuple[str, Corral, OpenAIResponsesMock],
) -> None:
    _kind, c, mock = other
    mock.script[:] = [{"text": "Submitted raysubmit_7."}, {"text": "Still running."}]
    c.serve()
    first = c.ok("submit", "--role", "agent", "--prompt", "submit it", "--cwd", str(c.work)).strip()
    c.wait(first, timeout=120)
    assert c.job(first)["state"] == "SUCCEEDED", c.engine_log()[-2000:]
    second = c.ok(
        "submit",
        "--role",
        "agent",
        "--prompt",
        "poll it",
        "--cwd",
        str(c.work),
        "--resume-from",
        first,
    ).strip()
    c.wait(second, timeout=120)
    assert c.job(second)["state"] == "SUCCEEDED"
    sessions = [c.json("trace", j)["agent_events"][0]["session_id"] for j in (first, second)]
    assert sessions[0] == sessions[1]
    last = json.dumps(mock.turn_requests[-1])
    assert "submit it" in last and "raysubmit_7" in last and "poll it" in last


def test_a_planning_loop_is_stopped_at_the_tool_call_budget(
    other: tuple[str, Corral, OpenAIResponsesMock],
) -> None:
    kind, c, mock = other
    mock.script[:] = [{"tool_calls": [bash("echo step >> steps.txt")], "loop": True}]
    c.serve()
    job = c.ok(
        "submit",
        "--role",
        "looper",
        "--prompt",
        "loop",
        "--cwd",
        str(c.work),
        "--max-tool-calls",
        "3",
    ).strip()
    c.wait(job, timeout=120)
    info = c.job(job)
    assert info["state"] == "FAILED" and info["limit_hit"] == "max_tool_calls", (kind, info)
    steps = (c.work / "steps.txt").read_text().splitlines()
    assert len(steps) == 3  # the bound: exactly the budget ran
    if kind == "opencode":  # max_turns is OpenCode's step limit: the model was told to stop,
        # ignored it, and the tool-call budget held (Codex has no turn limit at all)
        assert "MAXIMUM STEPS REACHED" in json.dumps(mock.turn_requests[-1])


@pytest.mark.parametrize("kind", ["codex", "opencode"])
def test_the_roles_mcp_servers_are_governed_like_any_tool(
    kind: str, tmp_path: Path, clis: None
) -> None:
    with OpenAIResponsesMock([], dialect=kind) as mock:
        role, log = mcp_role(kind, tmp_path)
        c = Corral(tmp_path, config(kind, mock.url, role))
        try:
            # the model asks for delete_run although neither CLI lets it see that tool
            # (OpenCode hides it, Codex's tool search cannot find it): it never runs
            mock.script[:] = mcp_script()
            c.serve()
            job = run_tracker(c, log)
            t: dict[str, Any] = c.json("trace", job)
            # each CLI spells MCP tools its own way; the engine decides mcp__<server>__<tool>
            assert [
                (e["subject"], e["verdict"])
                for e in t["policy_evaluations"]
                if e["stage"] == "tool_call"
            ] == [("mcp__wandb__list_runs", "allow")]
            [event] = t["agent_events"]
            if kind == "opencode":
                assert tool_names(mock.turn_requests[0]) == {"wandb_list_runs"}
                assert [x["tool"] for x in event["tool_calls"]] == [
                    "wandb_list_runs",
                    "wandb_delete_run",
                ]  # its own names, the 2nd refused:
                assert "unavailable tool" in event["tool_calls"][1]["output"]
            else:
                assert [x["tool"] for x in event["tool_calls"]] == ["mcp__wandb__list_runs"]
                assert "unsupported call" in json.dumps(mock.turn_requests[-1])
            assert not (tmp_path / "github.log").exists()  # a server out of scope never starts
        finally:
            c.stop_all()


def shells_role(kind: str, tools: str) -> str:
    return f"""  shells:
    worker: {kind}
    tools: {tools}
    limits: {{max_attempts: 1, timeout_s: 90, grace_s: 2}}
"""


def tool_call_evaluations(c: Corral, job: str) -> list[dict[str, Any]]:
    t: dict[str, Any] = c.json("trace", job)
    return [e for e in t["policy_evaluations"] if e["stage"] in ("tool_call", "guardrail")]


class _SessionAware(OpenAIResponsesMock):
    """Points a scripted `write_stdin` at the session Codex reported last (its ids vary)."""

    def next_turn(self) -> dict[str, Any]:
        turn = super().next_turn()
        last = json.dumps(self.turn_requests[-1]) if self.turn_requests else ""
        ids = re.findall(r"session ID (\d+)", last)
        calls = [
            dict(c, input={**c["input"], "session_id": int(ids[-1])})
            if c["name"] == "write_stdin" and ids
            else c
            for c in turn.get("tool_calls") or ()
        ]
        return {**turn, "tool_calls": calls} if calls else turn


def test_codex_calls_are_checked_under_the_shell_codex_runs_them_with(
    tmp_path: Path, clis: None
) -> None:
    """Codex's hook shows only the command; the shell the model names, a TTY session and the
    text typed into a session are read from Codex's transcript, refused, or find nothing to
    type into."""
    with _SessionAware([], dialect="codex") as mock:
        role = shells_role(
            "codex", '["Bash(echo *)", "Bash(sh *)", "Bash(sleep *)", "Write(./**)"]'
        )
        c = Corral(tmp_path, config("codex", mock.url, role))
        try:
            mock.script[:] = [
                # under dash: `echo ok &` then `>/dev/null touch dash.txt`
                {
                    "tool_calls": [
                        {
                            "name": "exec_command",
                            "input": {
                                "cmd": "echo ok &>/dev/null touch dash.txt",
                                "shell": "/bin/sh",
                            },
                        }
                    ]
                },
                # under bash: one `echo`, its output discarded
                {
                    "tool_calls": [
                        {
                            "name": "exec_command",
                            "input": {"cmd": "echo ok &>/dev/null touch bash.txt", "shell": "bash"},
                        }
                    ]
                },
                # an interactive session: what is typed into it later reaches no hook
                {
                    "tool_calls": [
                        {
                            "name": "exec_command",
                            "input": {"cmd": "sh", "tty": True, "yield_time_ms": 500},
                        }
                    ]
                },
                # a session without a TTY, still running when the call returns …
                {
                    "tool_calls": [
                        {"name": "exec_command", "input": {"cmd": "sleep 3", "yield_time_ms": 200}}
                    ]
                },
                # … and text typed into it
                {
                    "tool_calls": [
                        {
                            "name": "write_stdin",
                            "input": {
                                "session_id": 0,
                                "chars": "touch typed.txt\n",
                                "yield_time_ms": 200,
                            },
                        }
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "Write", "input": {"file_path": "../escape.txt", "content": "x"}}
                    ]
                },
                {"text": "Summary: only the harmless calls ran."},
            ]
            c.serve()
            job = c.ok(
                "submit", "--role", "shells", "--prompt", "try shells", "--cwd", str(c.work)
            ).strip()
            c.wait(job, timeout=120)
            assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-2000:]
            for name in ("dash.txt", "bash.txt", "typed.txt", "../escape.txt"):
                assert not (c.work / name).exists(), name
            found = [
                (e["verdict"], e["inputs"]["shell"], e["message"])
                for e in tool_call_evaluations(c, job)
            ]
            assert [(v, sh) for v, sh, _ in found] == [
                ("deny", "sh"),
                ("allow", "bash"),
                ("deny", "bash"),
                ("allow", "bash"),
                ("deny", "bash"),
            ]
            assert "runs under sh" in found[0][2]
            assert "interactive session" in found[2][2]
            assert "outside this role's write scope" in found[4][2]
            assert "stdin is closed" in json.dumps(mock.turn_requests[-1])  # Codex refused it
        finally:
            c.stop_all()


def test_opencode_runs_bash_whatever_shell_the_job_names(tmp_path: Path, clis: None) -> None:
    """OpenCode runs its bash tool with SHELL: the adapter makes it bash, the shell the checker
    reads commands as; and file tools are held to the role's paths."""
    with OpenAIResponsesMock([], dialect="opencode") as mock:
        role = shells_role("opencode", '["Bash(echo *)", "Read", "Write(out/**)"]')
        c = Corral(tmp_path, config("opencode", mock.url, role))
        (c.work / "out").mkdir()
        outside = tmp_path / "outside"
        outside.mkdir()
        try:
            mock.script[:] = [
                {"tool_calls": [bash("echo ok &>/dev/null touch dash.txt")]},
                {"tool_calls": [{"name": "Read", "input": {"file_path": "/etc/passwd"}}]},
                {
                    "tool_calls": [
                        {
                            "name": "Write",
                            "input": {"file_path": str(outside / "escape.txt"), "content": "x"},
                        }
                    ]
                },
                {
                    "tool_calls": [
                        {
                            "name": "Write",
                            "input": {"file_path": str(c.work / "out" / "ok.txt"), "content": "ok"},
                        }
                    ]
                },
                {"text": "Summary."},
            ]
            c.serve()
            job = c.ok(
                "submit",
                "--role",
                "shells",
                "--prompt",
                "try",
                "--cwd",
                str(c.work),
                "--setenv",
                "SHELL=/bin/sh",
            ).strip()  # dash, were it not for the adapter
            c.wait(job, timeout=120)
            assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-2000:]
            assert not (c.work / "dash.txt").exists()
            assert not (outside / "escape.txt").exists()
            assert (c.work / "out" / "ok.txt").read_text().strip() == "ok"
            found = [(e["subject"], e["verdict"]) for e in tool_call_evaluations(c, job)]
            assert found == [
                ("bash", "allow"),
                ("read", "deny"),
                ("apply_patch", "deny"),
                ("apply_patch", "allow"),
            ]
            assert "root:x:0:0" not in json.dumps(mock.turn_requests)  # /etc/passwd never read
        finally:
            c.stop_all()
