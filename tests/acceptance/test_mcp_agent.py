"""An agent asks Corral through its MCP server: the real Claude Code CLI (scripted model turns
from the loopback mock) is given `corral mcp` in its role's `mcp_config`, and each call it makes
to Corral's tools is decided like any other tool call — in the job's trace with its verdict,
and a guardrail that denies a Corral tool keeps the call from reaching Corral at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.conftest import CORRAL, Corral
from tests.acceptance.test_agents import agent_config, agents, trace  # noqa: F401
from tests.acceptance.test_agents_other_clis import config as other_config
from tests.agentmock import AnthropicMock, OpenAIResponsesMock, tool_names

RULES = """\
version: 1
roles:
  asker:
    - id: agents-do-not-queue-work
      when: {tool: "mcp__corral__submit_job"}
      verdict: deny
      reason: no_agent_submissions
      message: "this role asks Corral; it does not queue jobs"
"""


def asker(c: Corral, where: Path) -> str:
    """A role whose agent gets Corral's MCP server (read and write, as the local user) and may
    call list_jobs and submit_job (not its other tools) — the guardrails then deny submit_job."""
    servers = {
        "corral": {
            "command": CORRAL,
            "args": ["mcp", "--data-dir", str(c.data), "--config", str(c.config)],
        }
    }
    (where / "corral-mcp.json").write_text(json.dumps({"mcpServers": servers}))
    return f"""  asker:
    worker: claude-code
    tools: ["mcp__corral__list_jobs", "mcp__corral__submit_job"]
    mcp_config: {where / "corral-mcp.json"}
    limits: {{max_attempts: 1, timeout_s: 90, grace_s: 2}}
"""


def test_an_agent_asks_corral_over_mcp_and_each_call_is_governed(
    agents: tuple[Corral, AnthropicMock],  # noqa: F811
    tmp_path: Path,
) -> None:
    c, mock = agents
    (tmp_path / "rules.yaml").write_text(RULES)
    c.config.write_text(
        agent_config(mock.url, extra_role=asker(c, tmp_path))
        + f"guardrails: {tmp_path / 'rules.yaml'}\n"
    )
    earlier = c.submit("sh", "-c", "echo earlier")
    c.serve()
    assert c.wait(earlier) == 0
    mock.script[:] = [
        {"tool_calls": [{"name": "mcp__corral__list_jobs", "input": {"limit": 5}}]},
        {"tool_calls": [{"name": "mcp__corral__submit_job", "input": {"command": ["true"]}}]},
        {"tool_calls": [{"name": "mcp__corral__cluster_state", "input": {}}]},  # out of scope
        {"text": "Summary: one job is listed; queueing another was refused."},
    ]
    job = c.ok("submit", "--role", "asker", "--prompt", "what ran?", "--cwd", str(c.work)).strip()
    c.wait(job, timeout=120)
    assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-2000:]

    offered = tool_names(mock.turn_requests[0])
    assert {"mcp__corral__list_jobs", "mcp__corral__submit_job"} <= offered
    # list_jobs reached Corral and its answer reached the model: the earlier job, by id
    assert earlier in json.dumps(mock.turn_requests[1])
    decided = [
        (e["subject"], e["verdict"], e["reason"])
        for e in trace(c, job)["policy_evaluations"]
        if e["subject"].startswith("mcp__corral__")
    ]
    assert decided == [
        ("mcp__corral__list_jobs", "allow", "allowed"),
        ("mcp__corral__submit_job", "deny", "no_agent_submissions"),
        ("mcp__corral__cluster_state", "deny", "out_of_scope"),
    ]
    assert "this role asks Corral" in json.dumps(mock.turn_requests[2])  # the agent was told
    # the denied call never reached Corral: no job besides the two the test submitted
    assert {j["id"] for j in c.json("jobs")} == {earlier, job}


@pytest.mark.parametrize("kind", ["codex", "opencode"])
def test_codex_and_opencode_ask_corral_too(kind: str, tmp_path: Path, clis: None) -> None:
    """The same server in the same `mcp_config`, under the other CLIs: each spells the tool its
    own way; the engine decides `mcp__corral__list_jobs`, and Corral's answer reaches the model."""
    with OpenAIResponsesMock([], dialect=kind) as mock:
        c = Corral(tmp_path, "")
        role = asker(c, tmp_path).replace("claude-code", kind)
        role = role.replace(', "mcp__corral__submit_job"', "")
        c.config.write_text(other_config(kind, mock.url, role))
        try:
            earlier = c.submit("sh", "-c", "echo earlier")
            c.serve()
            assert c.wait(earlier) == 0
            mock.script[:] = [
                {"tool_calls": [{"name": "mcp__corral__list_jobs", "input": {"limit": 5}}]},
                {"text": "Summary: one job is listed."},
            ]
            job = c.ok(
                "submit", "--role", "asker", "--prompt", "what ran?", "--cwd", str(c.work)
            ).strip()
            c.wait(job, timeout=120)
            assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-2000:]
            decided = [
                (e["subject"], e["verdict"])
                for e in trace(c, job)["policy_evaluations"]
                if e["stage"] == "tool_call"
            ]
            assert decided == [("mcp__corral__list_jobs", "allow")]
            assert earlier in json.dumps(mock.turn_requests[1])
        finally:
            c.stop_all()
