"""Governed agents end to end: the real Claude Code CLI (pinned, from npm) against a loopback mock
of the Anthropic API, run by a real `corral serve`. Scripted model turns make the CLI call real
tools; Corral's hook decides each call before it runs.

Misbehaving agents are each contained, with the bound asserted: a planning loop, a tool-call
storm, a token explosion, a hang, a crash, a tool that leaves a `setsid` child behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.workers.proctab import alive, descendants
from tests.acceptance.conftest import Corral
from tests.agentmock import AnthropicMock, tool_names
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / "tests" / "agent-clis" / "node_modules" / ".bin" / "claude"
MCP_SERVER = ROOT / "tests" / "agentmock" / "mcp_server.py"
CANARY = "corral-canary-5e2b7d19af"
MCP_CANARY = "corral-mcp-canary-81c4aa03"  # a secret in an MCP server's env
API_KEY = "sk-ant-api03-corral-test-key-0123456789abcdef"


def agent_config(
    mock_url: str,
    *,
    limits: str = "",
    tools: str = '["Bash(ls *)", "Bash(echo *)", "Bash(touch *)", "Read", "Write(./**)"]',
    extra_role: str = "",
) -> str:
    return f"""
scheduler:
  poll_interval_s: 0.2
roles:
  default:
    retry: {{base_s: 0.05, cap_s: 0.2}}
  agent:
    worker: claude-code
    tools: {tools}
    system_prompt: You are a careful test agent.
    retry: {{base_s: 0.05, cap_s: 0.2}}
    limits: {{max_attempts: 1, timeout_s: 60, grace_s: 2{limits}}}
{extra_role}
workers:
  claude-code:
    binary: {CLAUDE}
    version: 2.1.330
    summary_grace_s: 1
    env: {{ANTHROPIC_BASE_URL: "{mock_url}", ANTHROPIC_API_KEY: "{API_KEY}"}}
"""


def mcp_role(worker: str, where: Path) -> tuple[str, Path]:
    """A role `tracker` whose agent gets the test MCP servers `wandb` and `github` and may list
    W&B runs only; and the `wandb` server's log of the messages it received."""
    log = where / "mcp.log"
    servers = {
        name: {
            "command": sys.executable,
            "args": [str(MCP_SERVER), str(where / f)],
            "env": {"WANDB_API_KEY": MCP_CANARY},
        }
        for name, f in (("wandb", "mcp.log"), ("github", "github.log"))
    }
    (where / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    return (
        f"""  tracker:
    worker: {worker}
    tools: ["mcp__wandb__list_runs"]
    mcp_config: {where / "mcp.json"}
    limits: {{max_attempts: 1, timeout_s: 90, grace_s: 2}}
""",
        log,
    )


def mcp_script(project: str = "eval") -> list[dict[str, Any]]:
    """Model turns: list the runs (in scope), delete one (out of scope), summarise."""
    return [
        {"tool_calls": [{"name": "mcp__wandb__list_runs", "input": {"project": project}}]},
        {"tool_calls": [{"name": "mcp__wandb__delete_run", "input": {"run": "run-1"}}]},
        {"text": "Summary: listed the runs; deleting one was refused."},
    ]


def run_tracker(c: Corral, log: Path) -> str:
    """Run a `tracker` job to success; only the call in scope reached the MCP server."""
    job = c.ok(
        "submit", "--role", "tracker", "--prompt", "tidy the runs", "--cwd", str(c.work)
    ).strip()
    c.wait(job, timeout=120)
    assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-2000:]
    messages = [json.loads(line) for line in log.read_text().splitlines()]
    assert [m["params"]["name"] for m in messages if m.get("method") == "tools/call"] == [
        "list_runs"
    ]
    return job


@pytest.fixture
def agents(tmp_path: Path, clis: None) -> Iterator[tuple[Corral, AnthropicMock]]:
    mock = AnthropicMock([]).start()
    c = Corral(tmp_path, agent_config(mock.url))
    try:
        yield c, mock
    finally:
        c.stop_all()
        mock.close()


def configure(c: Corral, mock: AnthropicMock, script: list[dict[str, Any]], **kw: Any) -> None:
    mock.script[:] = script
    c.config.write_text(agent_config(mock.url, **kw))


def run_agent(c: Corral, prompt: str = "do the task", *opts: str, timeout: float = 90) -> str:
    job = c.ok("submit", "--role", "agent", "--prompt", prompt, "--cwd", str(c.work), *opts).strip()
    c.wait(job, timeout=timeout)
    return job


def trace(c: Corral, job: str) -> dict[str, Any]:
    data: dict[str, Any] = c.json("trace", job)
    return data


def bash(command: str) -> dict[str, Any]:
    return {"name": "Bash", "input": {"command": command, "description": "step"}}


# ---------------------------------------------------------------------------- governance


def test_mcp_servers_come_from_the_role_and_their_calls_are_decided_by_its_scope(
    agents: tuple[Corral, AnthropicMock], tmp_path: Path
) -> None:
    c, mock = agents
    role, log = mcp_role("claude-code", tmp_path)
    configure(c, mock, mcp_script(MCP_CANARY), extra_role=role)
    c.serve()
    job = run_tracker(c, log)
    offered = tool_names(mock.turn_requests[0])
    assert {"mcp__wandb__list_runs", "mcp__wandb__delete_run"} <= offered
    assert not offered & {"Bash", "Read", "Edit"}  # no built-in tool is in this scope
    assert not any(name.startswith("mcp__github") for name in offered)  # nor that server:
    assert not (tmp_path / "github.log").exists()  # out of scope, it is never started
    t = trace(c, job)
    assert [
        (e["subject"], e["verdict"], e["reason"])
        for e in t["policy_evaluations"]
        if e["stage"] == "tool_call"
    ] == [
        ("mcp__wandb__list_runs", "allow", "allowed"),
        ("mcp__wandb__delete_run", "deny", "out_of_scope"),
    ]
    # the secret in the server's env is redacted wherever Corral writes (agent-home/ is the
    # CLI's own private memory; the file that carried the value to the runner is gone)
    assert [
        p
        for p in c.data.rglob("*")
        if p.is_file() and "agent-home" not in p.parts and MCP_CANARY.encode() in p.read_bytes()
    ] == []
    assert "[REDACTED]" in json.dumps(t["policy_evaluations"])
    assert not list(c.data.rglob("redact.json"))


def test_file_tools_are_held_to_the_roles_paths(
    agents: tuple[Corral, AnthropicMock], tmp_path: Path
) -> None:
    """Read and Write outside the scope are denied before they run (a link in the workspace
    leading out included); nothing is written and no content reaches the model."""
    c, mock = agents
    outside = tmp_path / "outside"
    outside.mkdir()
    (c.work / "out").mkdir()
    (c.work / "out" / "link").symlink_to(outside)
    configure(
        c,
        mock,
        [
            {"tool_calls": [{"name": "Read", "input": {"file_path": "/etc/passwd"}}]},
            {
                "tool_calls": [
                    {
                        "name": "Write",
                        "input": {"file_path": str(outside / "a.txt"), "content": "x"},
                    }
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "Write",
                        "input": {"file_path": str(c.work / "out/link/b.txt"), "content": "x"},
                    }
                ]
            },
            {"tool_calls": [bash(f"echo x > {outside / 'c.txt'}")]},
            {
                "tool_calls": [
                    {
                        "name": "Write",
                        "input": {"file_path": str(c.work / "out/ok.txt"), "content": "ok"},
                    }
                ]
            },
            {"text": "Summary: wrote out/ok.txt; the rest was refused."},
        ],
        tools='["Read", "Write(out/**)", "Bash(echo *)"]',
    )
    c.serve()
    job = run_agent(c)
    assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-2000:]
    assert list(outside.iterdir()) == []
    assert (c.work / "out" / "ok.txt").read_text() == "ok"
    t = trace(c, job)
    assert [
        (e["subject"], e["verdict"]) for e in t["policy_evaluations"] if e["stage"] == "tool_call"
    ] == [
        ("Read", "deny"),
        ("Write", "deny"),
        ("Write", "deny"),
        ("Bash", "deny"),
        ("Write", "allow"),
    ]
    assert "root:x:0:0" not in json.dumps(mock.turn_requests)  # /etc/passwd never read


def test_every_tool_call_is_decided_by_corral_and_traced(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    (c.work / "keep.txt").write_text("precious")
    configure(
        c,
        mock,
        [
            {"text": "Looking.", "tool_calls": [bash("ls > listed.txt")]},
            {"tool_calls": [bash("ls && rm -f keep.txt")]},  # compound: `rm` is out of scope
            {"tool_calls": [{"name": "Read", "input": {"file_path": str(c.work / "keep.txt")}}]},
            {"text": "Summary: listed the files; deleting was refused."},
        ],
    )
    c.serve()
    job = run_agent(c)
    info = c.job(job)
    assert info["state"] == "SUCCEEDED", info
    assert (c.work / "listed.txt").exists()
    assert (c.work / "keep.txt").read_text() == "precious"  # the denied call never ran

    t = trace(c, job)
    [event] = t["agent_events"]
    assert event["cli_version"] == "2.1.330"
    assert event["session_id"] and event["final_text"].startswith("Summary")
    calls = [(x["tool"], x["denied"]) for x in event["tool_calls"]]
    assert calls == [("Bash", False), ("Bash", True), ("Read", False)]
    denied = event["tool_calls"][1]
    assert "rm -f keep.txt" in denied["reason"] and "outside" in denied["reason"]
    assert event["tokens_in"] > 0 and event["tokens_out"] > 0 and event["cost_usd"] > 0
    assert event["checkpoint_count"] == 2  # one per tool call that ran
    assert [(e["stage"], e["verdict"], e["reason"]) for e in t["policy_evaluations"]] == [
        ("pre_run", "allow", "allowed"),
        ("pre_run", "allow", "allowed"),  # submit, dispatch
        ("tool_call", "allow", "allowed"),
        ("tool_call", "deny", "out_of_scope"),
        ("tool_call", "allow", "allowed"),
    ]
    # the model was told why: the denial reached it as the tool's result
    results = [
        b
        for r in mock.turn_requests
        for m in r["messages"]
        if m["role"] == "user"
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert any("outside this role's scope" in json.dumps(b) for b in results)
    shown = c.ok("show", job)
    assert "agent attempt 1" in shown and "tool calls 3 (1 denied)" in shown


def test_secrets_never_reach_the_store_or_the_logs(
    agents: tuple[Corral, AnthropicMock], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, mock = agents
    monkeypatch.setenv("CORRAL_TEST_CANARY", CANARY)  # the engine hands it to the job by name
    configure(
        c,
        mock,
        [
            {"tool_calls": [bash(f"echo {CANARY}")]},
            {"tool_calls": [bash("printenv CORRAL_TEST_CANARY")]},  # the value, from the env
            {"tool_calls": [bash(f"echo {API_KEY}")]},
            {"text": f"The secret was {CANARY}."},
        ],
        tools='["Bash(echo *)", "Bash(printenv *)"]',
    )
    c.serve()
    job = run_agent(c, "print the secret", "--secret-env", "CORRAL_TEST_CANARY")
    assert c.job(job)["state"] == "SUCCEEDED"
    event = trace(c, job)["agent_events"][0]
    assert [x["denied"] for x in event["tool_calls"]] == [False, False, False]
    assert any("[REDACTED]" in (x["output"] or "") for x in event["tool_calls"])
    leaks = []
    for path in c.data.rglob("*"):
        # agent-home/ is the CLI's own session memory (it must resume the real conversation):
        # private to the user, and not Corral's record of the run
        if path.is_file() and "agent-home" not in path.parts:
            data = path.read_bytes()
            leaks += [f"{path}: {s}" for s in (CANARY, API_KEY) if s.encode() in data]
    assert leaks == []
    assert (c.data / "agent-home").stat().st_mode & 0o077 == 0
    for args in (("trace", job, "--json"), ("show", job, "--json"), ("logs", job)):
        out = c.run(*args)
        assert CANARY not in out.stdout + out.stderr and API_KEY not in out.stdout


# ---------------------------------------------------------------------------- misbehaviour


def cmdlines() -> list[bytes]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                found.append((p / "cmdline").read_bytes())
            except OSError:
                continue
    return found


def count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_planning_loop_is_stopped_at_the_tool_call_budget(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    configure(
        c,
        mock,
        [{"tool_calls": [bash("echo step >> steps.txt")], "loop": True}],
        limits=", max_tool_calls: 4",
    )
    c.serve()
    job = run_agent(c)
    info = c.job(job)
    assert info["state"] == "FAILED" and info["limit_hit"] == "max_tool_calls", info
    assert count_lines(c.work / "steps.txt") == 4  # the bound: exactly the budget ran
    t = trace(c, job)
    assert t["agent_events"][0]["limit_hit"] == "max_tool_calls"
    denials = [e for e in t["policy_evaluations"] if e["verdict"] == "deny"]
    assert denials and {e["reason"] for e in denials} == {"max_tool_calls"}
    assert "summary" in denials[0]["message"]  # the agent is told to wrap up


def test_a_tool_call_storm_runs_no_more_than_the_budget(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    storm = [bash(f"echo {n} >> storm.txt") for n in range(20)]
    configure(c, mock, [{"tool_calls": storm}, {"text": "done"}], limits=", max_tool_calls: 5")
    c.serve()
    job = run_agent(c)
    assert c.job(job)["limit_hit"] == "max_tool_calls"
    assert count_lines(c.work / "storm.txt") == 5


def test_a_token_explosion_is_stopped_at_the_output_budget(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    configure(
        c,
        mock,
        [
            {
                "text": "thinking…",
                "tool_calls": [bash("echo a >> t.txt")],
                "usage": {"input_tokens": 100, "output_tokens": 6000},
                "loop": True,
            }
        ],
        limits=", token_budget_out: 10000",
    )
    c.serve()
    job = run_agent(c)
    info = c.job(job)
    assert info["state"] == "FAILED" and info["limit_hit"] == "token_budget_out", info
    assert count_lines(c.work / "t.txt") <= 2  # stopped within a turn of crossing the budget


def test_a_hung_agent_is_stopped_at_its_deadline_with_its_tree(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    configure(c, mock, [{"hang": True}])
    c.serve()
    job = c.ok(
        "submit",
        "--role",
        "agent",
        "--prompt",
        "hang",
        "--cwd",
        str(c.work),
        "--timeout",
        "4",
        "--grace",
        "1",
    ).strip()
    c.wait(job, timeout=60)
    info = c.job(job)
    assert info["state"] == "TIMED_OUT" and info["limit_hit"] == "max_duration_s", info
    a = info["attempts"][0]
    took = dt.datetime.fromisoformat(a["ended"]) - dt.datetime.fromisoformat(a["started"])
    assert took.total_seconds() < 4 + 1 + 1.5  # the bound: deadline + grace + a little
    pid = a["pid"]
    assert not alive(pid)


def test_a_crashing_agent_is_retried_within_its_bounds(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    # The tool SIGKILLs the agent's process (the runner around the CLI; Claude Code refuses to
    # pkill itself): a real crash, as an OOM kill would be. The marker keeps it to this job.
    marker = f"crash-{os.getpid()}-{id(c)}"
    configure(
        c,
        mock,
        [
            {
                "tool_calls": [
                    bash(f"pkill -9 -f '^[^ ]*python[^ ]* -m corral.workers.runner .*{marker}'")
                ],
                "loop": True,
            }
        ],
        tools='["Bash(pkill *)"]',
        limits=", max_attempts: 2",
    )
    c.serve()
    job = run_agent(c, f"task {marker}")
    info = c.job(job)
    assert info["state"] == "DEAD_LETTERED", info
    assert len(info["attempts"]) == 2
    assert [(a["state"], a["signal"]) for a in info["attempts"]] == [("FAILED", 9)] * 2


def test_a_tool_that_detaches_a_setsid_child_leaves_no_orphan(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    marker = "4242.5"
    configure(
        c,
        mock,
        [
            {"tool_calls": [bash(f"setsid sleep {marker} > /dev/null 2>&1 &")]},
            {"tool_calls": [bash("echo started")]},
            {"text": "done"},
        ],
        tools='["Bash(setsid *)", "Bash(sleep *)", "Bash(echo *)"]',
    )
    c.serve()
    job = run_agent(c)
    assert c.job(job)["state"] == "SUCCEEDED"

    def sleepers() -> list[int]:
        found = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if (p / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", marker.encode()]:
                        found.append(int(p.name))
                except OSError:
                    continue
        return [pid for pid in found if alive(pid)]

    eventually(lambda: not sleepers(), timeout=10, what="the detached child to be gone")


# ---------------------------------------------------------------------------- resume


def test_resume_from_continues_the_earlier_session(agents: tuple[Corral, AnthropicMock]) -> None:
    c, mock = agents
    configure(
        c,
        mock,
        [{"text": "Submitted ray job raysubmit_42."}, {"text": "raysubmit_42 is still running."}],
    )
    c.serve()
    first = run_agent(c, "submit the notebook")
    assert c.job(first)["state"] == "SUCCEEDED"
    session = trace(c, first)["agent_events"][0]["session_id"]
    second = run_agent(c, "poll the job", "--resume-from", first)
    assert c.job(second)["state"] == "SUCCEEDED"
    assert trace(c, second)["agent_events"][0]["session_id"] == session
    # The CLI's own resume sent the first conversation along with the new prompt.
    last = json.dumps(mock.turn_requests[-1]["messages"])
    assert "submit the notebook" in last and "raysubmit_42" in last and "poll the job" in last
    bad = c.run("submit", "--role", "default", "--resume-from", first, "--", "true")
    assert bad.returncode != 0 and "same worker kind" in bad.stderr


def test_an_attempt_lost_with_its_host_resumes_from_its_checkpoint(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    configure(
        c,
        mock,
        [
            {"tool_calls": [bash("echo one >> work.txt")]},
            {"text": "pausing", "delay_s": 60},  # the agent is busy when the host goes down
            {"text": "Resumed: work.txt already has step one."},
        ],
        limits=", max_attempts: 2",
    )
    engine = c.serve()
    job = c.ok(
        "submit", "--role", "agent", "--prompt", "step through", "--cwd", str(c.work)
    ).strip()
    db = sqlite3.connect(c.data / "corral.db")
    eventually(
        lambda: (
            db.execute("SELECT COUNT(*) FROM checkpoints WHERE job_id = ?", (job,)).fetchone()[0]
            == 1
        ),
        timeout=60,
        what="a checkpoint after the first tool call",
    )
    session = db.execute("SELECT session_id FROM checkpoints WHERE job_id = ?", (job,)).fetchone()[
        0
    ]
    # The second turn was asked for (the mock holds it): killed now, the CLI is mid-turn.
    eventually(lambda: len(mock.turn_requests) >= 2, timeout=30, what="the second turn")
    # The host "crashes": the engine and the whole attempt (shim, runner, CLI) die at once.
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    [attempt_dir] = (c.data / "attempts").glob(f"{job}.1")
    shim = int((attempt_dir / "shim.pid").read_text())
    tree = [shim, *descendants(shim)]  # shim, runner, CLI, its tools: the whole host is gone
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    eventually(lambda: not any(alive(p) for p in tree), timeout=10, what="the tree to die")
    c.serve()
    assert c.wait(job, timeout=90) == 0
    info = c.job(job)
    assert info["state"] == "SUCCEEDED" and len(info["attempts"]) == 2, info
    assert info["attempts"][0]["state"] == "LOST"
    events = trace(c, job)["agent_events"]
    assert events[-1]["session_id"] == session and events[-1]["retry_count"] == 1
    # Not a cold start: the resumed CLI sent the earlier conversation, tool call included.
    assert "echo one >> work.txt" in json.dumps(mock.turn_requests[-1]["messages"])
    db.close()


def test_a_tool_call_while_the_engine_is_down_is_denied(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    down = c.work.parent / "engine-down"
    configure(
        c,
        mock,
        [
            {
                "text": "Working.",
                "tool_calls": [bash("touch during-outage.txt")],
                "wait_for": str(down),
            },
            {"text": "The call was refused; stopping here."},
        ],
    )
    engine = c.serve()
    job = c.ok("submit", "--role", "agent", "--prompt", "go", "--cwd", str(c.work)).strip()
    assert c.wait(job, until="running", timeout=30) == 0
    engine.send_signal(signal.SIGKILL)  # the agent asks while nobody can answer
    engine.wait()
    down.touch()
    eventually(
        lambda: len(mock.turn_requests) >= 2,
        timeout=30,
        what="the agent to get its answer and go on",
    )
    assert not (c.work / "during-outage.txt").exists()  # fail closed: the call never ran
    assert "fail-closed" in json.dumps(mock.turn_requests[1]["messages"])
    c.serve()  # the next engine re-adopts the attempt and collects its end
    assert c.wait(job, timeout=60) == 0
    [event] = trace(c, job)["agent_events"]
    assert [x["denied"] for x in event["tool_calls"]] == [True]


def test_a_tool_call_the_hook_gave_up_on_is_recorded_as_what_happened(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    """The engine stalls (SIGSTOP) while the agent asks about a tool call: the hook gives up
    after hook_timeout_s and denies it; the engine, resumed, reads the request late and records
    that denial (hook_timeout), not the `allow` it would have given."""
    c, mock = agents
    stopped, resumed = c.work.parent / "engine-stopped", c.work.parent / "engine-resumed"
    configure(
        c,
        mock,
        [
            {
                "text": "Working.",
                "tool_calls": [bash("touch while-stalled.txt")],
                "wait_for": str(stopped),
            },
            {"text": "The call was refused; stopping here.", "wait_for": str(resumed)},
        ],
    )
    c.config.write_text(
        c.config.read_text().replace(
            "    summary_grace_s: 1\n", "    summary_grace_s: 1\n    hook_timeout_s: 1\n"
        )
    )
    engine = c.serve()
    job = c.ok("submit", "--role", "agent", "--prompt", "go", "--cwd", str(c.work)).strip()
    eventually(lambda: len(mock.turn_requests) >= 1, timeout=30, what="the agent's first turn")
    engine.send_signal(signal.SIGSTOP)
    try:
        stopped.touch()  # the model answers with the tool call; nobody reads the hook's request
        eventually(
            lambda: len(mock.turn_requests) >= 2,
            timeout=30,
            what="the hook to give up and the agent to go on",
        )
    finally:
        engine.send_signal(signal.SIGCONT)
    assert not (c.work / "while-stalled.txt").exists()  # the call never ran
    verdicts = eventually(
        lambda: [
            (e["verdict"], e["reason"])
            for e in trace(c, job)["policy_evaluations"]
            if e["stage"] != "pre_run"
        ],
        what="the late request to be recorded",
    )
    assert verdicts == [("deny", "hook_timeout")]
    resumed.touch()
    assert c.wait(job, timeout=60) == 0
    [event] = trace(c, job)["agent_events"]
    assert [x["denied"] for x in event["tool_calls"]] == [True]


def test_cancel_interrupts_the_agent_first_so_it_can_say_it_stopped(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    marker = f"time.sleep(60.{os.getpid()})"
    configure(
        c,
        mock,
        [
            {"tool_calls": [bash(f"python3 -c 'import time; {marker}'")]},
            {"text": "never reached"},
        ],
        tools='["Bash(python3 *)"]',
    )
    # A grace long enough for a loaded machine: the CLI must be interrupted, not killed.
    c.config.write_text(c.config.read_text().replace("grace_s: 2}", "grace_s: 20}"))
    c.serve()
    job = c.ok("submit", "--role", "agent", "--prompt", "wait", "--cwd", str(c.work)).strip()
    eventually(
        lambda: any(marker.encode() in cmd for cmd in cmdlines()),
        timeout=30,
        what="the long tool call to be running",
    )
    c.ok("cancel", job)
    assert c.wait(job, timeout=30) != 0
    info = c.job(job)
    assert info["state"] == "CANCELLED"
    # Claude Code got SIGINT (not SIGTERM, not SIGKILL): it aborted the tool, said so in its
    # stream and exited on its own. Its result line usually follows, but Claude Code 2.1.330's
    # print-mode SIGINT handler aborts the turn and starts its own shutdown at once, so under
    # load the process can exit before the turn's loop writes the result (seen in CI): that line
    # is the CLI's race, asserted only when it is there.
    attempt = info["attempts"][0]
    logs = Path(attempt["log_dir"])
    stream = (logs / "stdout.log").read_text()
    why = (
        f"attempt: {attempt}\nstdout tail: {stream[-2000:]}\n"
        f"stderr tail: {(logs / 'stderr.log').read_text()[-2000:]}\n"
        f"engine log tail: {c.engine_log()[-3000:]}"
    )
    assert attempt["signal"] is None and attempt["exit_code"] == 0, why
    assert "[Request interrupted by user" in stream, why
    results = [json.loads(line) for line in stream.splitlines() if '"type":"result"' in line]
    assert all(r["subtype"] == "error_during_execution" for r in results), why
    assert trace(c, job)["agent_events"][0]["outcome"] == "cancelled"


def test_a_guardrail_sends_a_tool_call_to_a_human_and_only_that_call_is_approved(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    uninstall = "helm uninstall web --force"  # a typed --force is not consent
    approved = c.work.parent / "approved"
    configure(
        c,
        mock,
        [
            {"tool_calls": [bash(uninstall)]},
            {"tool_calls": [bash("helm uninstall db --force")]},  # another release
            # the exact command, once the operator approved it
            {"tool_calls": [bash(uninstall)], "wait_for": str(approved)},
            {"text": "done"},
        ],
        tools='["Bash(helm *)"]',
        extra_role="",
    )
    c.config.write_text(c.config.read_text().replace("  agent:\n", "  cluster:\n"))
    c.serve()
    job = c.ok(
        "submit", "--role", "cluster", "--prompt", "remove web", "--cwd", str(c.work)
    ).strip()
    pending = eventually(
        lambda: [a for a in c.json("approvals", "list") if a["subject"] == uninstall],
        timeout=30,
        what="an approval request",
    )
    assert [(a["job_id"], a["subject"], a["state"]) for a in pending] == [
        (job, uninstall, "pending")
    ]
    c.ok("approvals", "approve", pending[0]["id"], "--note", "ok for web only")
    approved.touch()
    assert c.wait(job, timeout=60) == 0
    verdicts = [
        (e["stage"], e["verdict"], e["reason"]) for e in trace(c, job)["policy_evaluations"]
    ]
    assert verdicts == [
        ("pre_run", "allow", "allowed"),
        ("pre_run", "allow", "allowed"),
        ("guardrail", "deny", "approval_required"),
        ("guardrail", "deny", "approval_required"),  # db: its own request
        ("guardrail", "allow", "approved"),
    ]
    assert [a["subject"] for a in c.json("approvals", "list")] == ["helm uninstall db --force"]


def test_a_budget_ceiling_stops_a_run_that_crosses_it_and_denies_the_next(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    # Sonnet 4.5 prices: 2,000 in + 500 out tokens = $0.0135 per turn, over a $0.01 ceiling.
    configure(
        c,
        mock,
        [
            {
                "tool_calls": [bash("echo step >> steps.txt")],
                "loop": True,
                "usage": {"input_tokens": 2000, "output_tokens": 500},
            }
        ],
    )
    c.config.write_text(
        c.config.read_text().replace(
            "    summary_grace_s: 1\n", "    summary_grace_s: 1\n    model: claude-sonnet-4-5\n"
        )
    )
    c.serve()
    c.ok(
        "budget",
        "set",
        "--scope",
        "tenant",
        "--target",
        "acme",
        "--period",
        "daily",
        "--ceiling-usd",
        "0.01",
    )
    job = run_agent(c, "spend", "--tenant", "acme")
    info = c.job(job)
    assert info["state"] == "FAILED" and info["limit_hit"] == "budget_ceiling", info
    assert count_lines(c.work / "steps.txt") <= 3  # stopped within a turn or two of crossing
    report = eventually(
        lambda: c.run("report", job).returncode == 0 and c.json("report", job), what="the report"
    )
    assert "budget_overrun" in {i["type"] for i in report["incidents"]}
    late = c.ok("submit", "--role", "agent", "--prompt", "more", "--tenant", "acme").strip()
    c.wait(late, timeout=30)
    denied = c.job(late)
    assert denied["state"] == "DENIED" and "budget_ceiling_exceeded" in denied["last_error"]


# The guardrail classes, as a reader role's agent tries them (one turn, one call each): the
# running engine decides each call through the hook exactly as `corral guard check` does.
READER = (
    '["Bash(kubectl get *)", "Bash(kubectl describe *)", "Bash(ray job submit *)", '
    '"Bash(ray job status *)", "Bash(helm status *)", "Read", "Write(out/**)"]'
)
CLASS_COMMANDS = [
    "kubectl get pods > ~/.bashrc",  # a redirection is a write
    "sudo kubectl get pods",  # a privilege change
    "nohup kubectl get pods &",  # detached from the attempt
    "bash -c 'kubectl get pods'",  # a shell wrapper
    "./kubectl get pods",  # a path-qualified program
    "kubectl get po*",  # an unquoted glob
    "kubectl get pods\uff1b rm -rf /",  # a look-alike semicolon
    "ray job submit -- 'ray job status x; rm -rf /'",  # a command that runs a command
    "kubectl get secret db -o yaml",  # a sensitive read through an allowed verb
    "kubectl get pods",  # and one that is allowed
]


def test_the_engine_decides_each_guardrail_class_as_guard_check_does(
    agents: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = agents
    configure(
        c,
        mock,
        [{"tool_calls": [bash(cmd) for cmd in CLASS_COMMANDS]}, {"text": "done"}],
        tools=READER,
    )
    c.serve()
    job = run_agent(c)
    engine = {
        e["inputs"]["input"]["command"]: e["verdict"]
        for e in trace(c, job)["policy_evaluations"]
        if e["stage"] != "pre_run"
    }
    checked = {}
    for cmd in CLASS_COMMANDS:
        r = c.run("guard", "check", "--role", "agent", "--cwd", str(c.work), "--json", "--", cmd)
        checked[cmd] = json.loads(r.stdout)["verdict"]
    assert engine == checked
    assert [cmd for cmd, verdict in engine.items() if verdict == "allow"] == ["kubectl get pods"]
