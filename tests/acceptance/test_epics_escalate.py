"""Escalation end to end (docs/how-to/epics.md): a real `corral serve` runs an epic whose
council is one Claude Code judge and one Codex judge, each the real pinned CLI against its
scripted model stand-in, in a temporary git repository.

`big` fails its only try and is re-decomposed: a decomposer agent writes `proposal.json`, and
Corral replaces `big` with the two smaller tasks it proposes (the second carrying big's
check); `after`, which depended on `big`, now waits for them. On `after` the judges disagree
across vendors (Claude PASS, Codex FAIL): DISAGREE is shown and `corral approvals approve`
decides it. The epic ends done with exactly the three passing tasks' commits, in order, and
no worktree or branch of a try left behind."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance import test_epics as epics
from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents_other_clis import codex_worker
from tests.acceptance.test_epics import RoutedAgents, Turn, git, new_repo, write
from tests.acceptance.test_json_schemas import conforms
from tests.agentmock import OpenAIResponsesMock
from tests.helpers import eventually

WORKER = re.compile(r"Task ([\w-]+) of epic \w+, try (\d+)\. You work in (\S+), a git")
JUDGE = re.compile(r"Then write (\S+/verdict\.json):.*The task is ([\w-]+), try (\d+)\.", re.S)
DECOMPOSER = re.compile(r"Task ([\w-]+) of an epic failed.*Then write (\S+/proposal\.json):", re.S)


def verdict(path: str, task: str, says: str) -> list[Turn]:
    body = {"verdict": says, "confidence": "HIGH", "key_insight": f"{task}: {says}"}
    return [write(path, json.dumps(body)), {"text": "Verdict written."}]


class ClaudeAgents(RoutedAgents):
    """Claude Code for the workers, the decomposer and the first judge (always PASS)."""

    def route(self, first: str) -> tuple[tuple[str, ...], list[Turn]] | None:
        if m := JUDGE.search(first):
            path, task, attempt = m.groups()
            return ("judge", task, attempt), verdict(path, task, "PASS")
        if m := DECOMPOSER.search(first):
            task, path = m.groups()
            proposal = {
                "tasks": [
                    {"id": "one", "prompt": "Write big.txt holding the line big."},
                    {"id": "two", "prompt": "Add the line done.", "depends_on": ["one"]},
                ]
            }
            return ("decomposer", task), [
                write(path, json.dumps(proposal)),
                {"text": "Proposal written."},
            ]
        if m := WORKER.search(first):
            task, attempt, work = m.groups()
            files = {
                "big": ("big.txt", "big\n"),  # never `done`: its check fails
                "big-one": ("big.txt", "big\n"),
                "big-two": ("big.txt", "big\ndone\n"),
                "after": ("after.txt", "after\n"),
            }
            name, content = files[task]
            return ("worker", task, attempt), [
                write(f"{work}/{name}", content),
                {"text": f"Summary: {task} written."},
            ]
        return None


class CodexJudge(OpenAIResponsesMock):
    """Codex for the second judge: FAIL on `after`, PASS on the rest."""

    def __init__(self) -> None:
        super().__init__([], dialect="codex")
        self.judged: list[str] = []
        self._here = threading.local()

    def _handle(self, handler: Any, method: str, body: Any) -> None:
        self._here.body = body
        super()._handle(handler, method, body)

    def next_turn(self) -> Turn:
        body = getattr(self._here, "body", None) or {}
        items = body.get("input") or []
        m = JUDGE.search(json.dumps(items).encode().decode("unicode_escape"))
        if m is None:
            return {"text": "done"}
        _path, task, _attempt = m.groups()
        n = sum(1 for i in items if str(i.get("type", "")).endswith("_call"))
        if n == 0:
            self.judged.append(task)
        script = verdict("verdict.json", task, "FAIL" if task == "after" else "PASS")
        return script[n] if n < len(script) else {"text": "done"}


EPIC = """\
name: split
council: {judges: 2, roles: [judge, judge-codex]}
tasks:
  - id: big
    role: coder
    prompt: Write big.txt holding the lines big and done.
    checks: ["grep -qx done big.txt"]
    max_attempts: 1
    on_exhausted: decompose
  - id: after
    role: coder
    prompt: Write after.txt holding the line after.
    depends_on: [big]
    checks: ["grep -qx after after.txt"]
"""


def config(claude_url: str, codex_url: str) -> str:
    """The epics test's, with a judge role on Codex: a council across vendors."""
    judge_codex = """\
  judge-codex:
    worker: codex
    concurrency: 4
    tools: ["Read", "Write(./**)"]
    limits: {max_attempts: 1, timeout_s: 120, grace_s: 2}
"""
    base = epics.config(claude_url).replace("environments:", judge_codex + "environments:")
    return base + codex_worker(codex_url).lstrip("\n")


@pytest.fixture
def env(tmp_path: Path, clis: None) -> Iterator[tuple[Corral, ClaudeAgents, CodexJudge, Path]]:
    claude, codex = ClaudeAgents().start(), CodexJudge().start()
    assert isinstance(claude, ClaudeAgents) and isinstance(codex, CodexJudge)
    c = Corral(tmp_path, config(claude.url, codex.url))
    repo = new_repo(tmp_path / "repo", "split\n")
    try:
        yield c, claude, codex, repo
    finally:
        c.stop_all()
        claude.close()
        codex.close()


def test_a_spent_task_is_re_decomposed_and_a_cross_vendor_disagreement_goes_to_a_human(
    env: tuple[Corral, ClaudeAgents, CodexJudge, Path],
) -> None:
    c, claude, codex, repo = env
    (c.work / "epic.yaml").write_text(EPIC)
    base = git(repo, "rev-parse", "HEAD")
    c.serve()
    epic = c.ok("epic", "run", "epic.yaml", "--repo", str(repo)).strip()

    def after() -> dict[str, Any] | None:
        shown = c.json("epic", "show", epic)
        assert shown["state"] == "running", shown
        found = [t for t in shown["tasks"] if t["id"] == "after" and t["state"] == "escalated"]
        return found[0] if found else None

    escalated = eventually(after, timeout=300, what="after's council to disagree")
    v = escalated["verdict"]
    assert (v["council"], v["gate"]) == ("DISAGREE", "escalate")
    assert sorted((j["vendor"], j["verdict"]) for j in v["judges"]) == [
        ("claude-code", "PASS"),
        ("codex", "FAIL"),
    ]
    [pending] = [a for a in c.json("approvals", "list") if a["id"] == v["approval"]]
    assert pending["reason"] == "council_disagree"
    c.ok("approvals", "approve", v["approval"])

    shown = eventually(
        lambda: (d := c.json("epic", "show", epic))["state"] != "running" and d,
        timeout=120,
        what="the epic to end",
    )
    conforms("EpicShow", shown)
    tasks = {t["id"]: t for t in shown["tasks"]}
    assert shown["state"] == "done", shown
    assert list(tasks) == ["big", "big-one", "big-two", "after"]
    assert tasks["big"]["state"] == "decomposed"
    assert tasks["big"]["verdict"]["replaced_by"] == ["big-one", "big-two"]
    assert all(tasks[t]["state"] == "passed" for t in ("big-one", "big-two", "after"))

    log = git(repo, "log", "--reverse", "--format=%an|%s", f"{base}..epic/split")
    assert log.splitlines() == [
        "Corral|big-one: Write big.txt holding the line big.",
        "Corral|big-two: Add the line done.",
        "Corral|after: Write after.txt holding the line after.",
    ]
    assert git(repo, "show", "epic/split:big.txt") == "big\ndone"
    # Each agent once; the judges of both vendors sat on each council.
    assert all(n == 1 for n in claude.starts.values()), claude.starts
    assert claude.starts.get(("decomposer", "big")) == 1
    assert sorted(codex.judged) == ["after", "big-one", "big-two"]
    # No try's worktree or branch outlives the epic.
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["epic/split", "main"]
