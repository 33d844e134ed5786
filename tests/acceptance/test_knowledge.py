"""The knowledge flywheel end to end: a real `corral serve` runs the real Claude Code CLI against
the scripted model stand-in (tests/agentmock). A learning extracted from run 1 reaches run 2's
system prompt (the stand-in records the request it received), and its utility moves when run 2
ends; `corral knowledge` shows, searches, promotes, retires and measures it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents import agent_config, bash
from tests.agentmock import AnthropicMock, OpenAIResponsesMock
from tests.helpers import eventually

LEARNER = """  learner:
    worker: claude-code
    tools: ["Bash(echo *)"]
    system_prompt: You are a careful test agent.
    knowledge: on
    retry: {base_s: 0.05, cap_s: 0.2}
    limits: {max_attempts: 1, timeout_s: 60, grace_s: 2}
"""
CORE = "core:\n  heartbeat_timeout_s: 30\n"
FIX = "Summary: the failing check was fixed by touching ready.txt first."


@pytest.fixture
def learner(tmp_path: Path, clis: None) -> Iterator[tuple[Corral, AnthropicMock]]:
    mock = AnthropicMock([]).start()
    # A patient core supervisor: on a loaded machine a core starved of CPU for 5 s is not dead
    # (this test is about what the agent is given, not about the core's liveness)
    c = Corral(tmp_path, CORE + agent_config(mock.url, extra_role=LEARNER))
    try:
        yield c, mock
    finally:
        c.stop_all()
        mock.close()


def run(c: Corral, prompt: str) -> str:
    job = c.ok("submit", "--role", "learner", "--prompt", prompt, "--cwd", str(c.work)).strip()
    c.wait(job, timeout=90)
    assert c.job(job)["state"] == "SUCCEEDED", c.engine_log()[-3000:]
    return job


def system_text(request: Any) -> str:
    system = request.get("system")
    return system if isinstance(system, str) else json.dumps(system)


def test_a_learning_from_run_one_is_injected_into_run_two_and_its_utility_moves(
    learner: tuple[Corral, AnthropicMock],
) -> None:
    c, mock = learner
    mock.script[:] = [{"tool_calls": [bash("echo checking")]}, {"text": FIX}]
    c.serve()
    one = run(c, "fix the failing check")
    assert "Learnings from earlier runs" not in system_text(mock.turn_requests[0])

    # the run's report is written, then its learning: a solution (silver), active
    learned = eventually(lambda: c.json("knowledge", "list") or None, what="a learning")
    [item] = learned
    assert (item["kind"], item["tier"], item["status"]) == ("solution", "silver", "active")
    assert item["provenance"]["job_id"] == one and item["utility"] == 0.5
    assert "fixed by touching ready.txt" in item["title"]

    seen = len(mock.turn_requests)
    mock.script[:] = [{"text": "Summary: done again."}]
    two = run(c, "fix the failing check")
    system = system_text(mock.turn_requests[seen])
    assert "You are a careful test agent." in system  # the role's own prompt, then the learning
    assert "Learnings from earlier runs" in system and item["id"] in system
    assert "fixed by touching ready.txt first." in system

    def rewarded() -> dict[str, Any] | None:
        shown: dict[str, Any] = c.json("knowledge", "show", item["id"])
        return shown if shown["rewards"] == 1 else None

    shown = eventually(rewarded, what="the learning's reward")
    assert shown["utility"] == pytest.approx(0.59)  # 0.7·0.5 + 0.3·0.8: run 2 succeeded
    assert [h["action"] for h in shown["history"]] == ["created", "rewarded"]
    assert [(g["job_id"], g["attempt"], g["reward"]) for g in shown["cited_by"]] == [(two, 1, 0.8)]
    stats = c.json("knowledge", "stats")
    [role] = stats["roles"]
    assert role["role"] == "learner"
    assert (role["with"]["runs"], role["with"]["succeeded"]) == (1, 1)  # run 2
    assert (role["without"]["runs"], role["without"]["succeeded"]) == (1, 1)  # run 1: none yet
    assert role["without"]["tool_calls"] == 1 and role["with"]["tool_calls"] == 0
    metrics = c.ok("metrics")
    assert 'corral_knowledge_runs_total{arm="with",role="learner"} 1.0' in metrics

    # search (the store's FTS5 index), retire, and the next run is given nothing
    assert [x["id"] for x in c.json("knowledge", "search", "ready")] == [item["id"]]
    assert c.json("knowledge", "search", "kubernetes") == []
    c.ok("knowledge", "retire", item["id"][-6:], "--reason", "the check is gone")
    seen = len(mock.turn_requests)
    mock.script[:] = [{"text": "Summary: third."}]
    run(c, "fix the failing check")
    assert "Learnings from earlier runs" not in system_text(mock.turn_requests[seen])
    bad = c.run("knowledge", "promote", item["id"])
    assert bad.returncode != 0 and "only a learning that is pending" in bad.stderr
    assert "Traceback" not in bad.stderr


EXTRACTOR = """  extractor:
    worker: claude-code
    tools: ["Bash(echo *)", "Write(./**)"]
    retry: {base_s: 0.05, cap_s: 0.2}
    limits: {max_attempts: 1, timeout_s: 60, grace_s: 2}
knowledge:
  extractor: agent:extractor
"""
WRITTEN = [
    {
        "kind": "solution",
        "title": "Touch ready.txt before the check",
        "body": "The check fails until `ready.txt` exists.\n- Run `touch ready.txt` first.",
        "confidence": "high",
        "job_id": "forged-by-the-agent",
    },
    {"kind": "gossip", "title": "refused", "body": "an unknown kind is refused"},
]


@pytest.mark.parametrize("worker", ["claude-code", "codex"])
def test_an_agent_job_extracts_the_learnings_governed_like_any_job(
    tmp_path: Path, clis: None, worker: str
) -> None:
    """The learner runs Claude Code; its extractor Claude Code too, or Codex (its own mock)."""
    from tests.acceptance.test_agents_other_clis import config as other_config

    mock = AnthropicMock([]).start()
    codex = OpenAIResponsesMock([], dialect="codex").start()
    extractor_mock: Any = mock if worker == "claude-code" else codex
    roles = LEARNER + EXTRACTOR.replace("worker: claude-code", f"worker: {worker}")
    text = CORE + agent_config(mock.url, extra_role=roles)
    text += other_config("codex", codex.url).split("workers:", 1)[1]  # the codex worker too
    c = Corral(tmp_path, text)
    try:
        written, elsewhere = json.dumps(WRITTEN), tmp_path / "elsewhere.json"
        mock.script[:] = [{"text": FIX}]  # run one, of the learner
        extractor_mock.script[len(extractor_mock.script) :] = [
            {"tool_calls": [bash(f"echo '{written}' > learnings.json")]},  # its extractor job
            {"tool_calls": [bash(f"echo '{written}' > {elsewhere}")]},  # out of its scope
            {"text": "Summary: wrote learnings.json."},
        ]
        c.serve()
        one = run(c, "fix the failing check")

        # its extractor is a whole agent job of its own: a loaded machine takes its time
        [item] = eventually(
            lambda: c.json("knowledge", "list") or None, timeout=90, what="a learning"
        )
        assert (item["kind"], item["title"]) == ("solution", "Touch ready.txt before the check")
        assert (item["role"], item["provenance"]["job_id"]) == ("learner", one)  # Corral's
        [extractor] = [j for j in c.json("jobs") if j["id"] != one]
        assert (extractor["role"], extractor["state"]) == ("extractor", "SUCCEEDED")
        history = c.json("knowledge", "show", item["id"])["history"]
        assert f"by extractor job {extractor['id']}" in history[0]["reason"]
        # its prompt carried the run; it ran under its role's scope (the write elsewhere denied)
        first = extractor_mock.turn_requests[1 if worker == "claude-code" else 0]
        assert "fixed by touching ready.txt" in json.dumps(first)
        verdicts = [
            e["verdict"]
            for e in c.json("trace", extractor["id"])["policy_evaluations"]
            if e["stage"] == "tool_call"
        ]
        assert verdicts == ["allow", "deny"]
        assert not elsewhere.exists()
        assert not (c.data / "knowledge" / "extract" / one).exists()  # its folder, removed
        # the extractor's own end is never extracted: still two jobs, one learning
        c.stop_all()
        assert len(c.json("jobs")) == 2 and len(c.json("knowledge", "list")) == 1
    finally:
        c.stop_all()
        mock.close()
        codex.close()
