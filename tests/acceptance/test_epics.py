"""Epics end to end (waves): a real `corral serve` runs an epic's waves with the real
Claude Code CLI against the scripted model stand-in, in a temporary git repository.

Three tasks: alpha passes at once; beta fails its check, then passes on its retry; gamma fails
three times (trying `git commit` on the way, refused by guardrail) and is struck. Each try is a
fresh agent in its own worktree; the council's judge writes a verdict file. The epic branch
ends with exactly alpha's and beta's commits, in that order, made by Corral. The engine is
SIGKILLed while beta's retry runs: the next engine resumes the wave without a second worker
for that try."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents import API_KEY, CLAUDE
from tests.acceptance.test_json_schemas import conforms
from tests.agentmock import AnthropicMock
from tests.helpers import eventually

WORKER = re.compile(r"Task (\w+) of epic \w+, try (\d+)\. You work in (\S+), a git")
JUDGE = re.compile(r"Then write (\S+/verdict\.json):.*The task is (\w+), try (\d+)\.", re.S)
Turn = dict[str, Any]
SECRET = "corral-epic-secret-4f1d9a"


def write(path: str, content: str) -> Turn:
    return {"tool_calls": [{"name": "Write", "input": {"file_path": path, "content": content}}]}


class RoutedAgents(AnthropicMock):
    """The stand-in model for many agents at once: each conversation's script is the one
    `route` chooses by its first prompt, and its turn is the number of model answers in it so
    far (the CLI sends the whole conversation each time)."""

    def __init__(self) -> None:
        super().__init__([])
        self.starts: dict[tuple[str, ...], int] = {}  # conversations begun, per agent
        self._here = threading.local()
        self._count = threading.Lock()

    def _handle(self, handler: Any, method: str, body: Any) -> None:
        self._here.body = body
        super()._handle(handler, method, body)

    def route(self, first: str) -> tuple[tuple[str, ...], list[Turn]] | None:
        """The agent (its key in `starts`) and its script, for a conversation's first prompt."""
        raise NotImplementedError

    def next_turn(self) -> Turn:
        body = getattr(self._here, "body", None) or {}
        messages = body.get("messages") or []
        first = json.dumps(messages[0]["content"]) if messages else ""
        routed = self.route(first.encode().decode("unicode_escape"))
        if routed is None:
            return {"text": "done"}
        key, script = routed
        n = sum(1 for m in messages if m.get("role") == "assistant")
        if n == 0:
            with self._count:
                self.starts[key] = self.starts.get(key, 0) + 1
        return script[n] if n < len(script) else {"text": "done"}


class RoutedMock(RoutedAgents):
    """Workers by task and try, and judges that always PASS."""

    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate  # beta's retry waits for it: the engine is killed meanwhile

    def route(self, first: str) -> tuple[tuple[str, ...], list[Turn]] | None:
        if m := JUDGE.search(first):
            path, task, attempt = m.groups()
            return ("judge", task, attempt), [
                write(path, json.dumps({"verdict": "PASS", "confidence": "HIGH",
                                        "key_insight": f"{task} does what it says"})),
                {"text": "Verdict written."},
            ]  # fmt: skip
        if m := WORKER.search(first):
            task, attempt, work = m.groups()
            return ("worker", task, attempt), self.worker(task, int(attempt), work)
        return None

    def worker(self, task: str, attempt: int, work: str) -> list[Turn]:
        if task == "alpha":
            return [write(f"{work}/alpha.txt", "alpha\n"), {"text": "Summary: alpha written."}]
        if task == "beta" and attempt == 1:
            return [write(f"{work}/beta.txt", "bet\n"), {"text": "Summary: beta written."}]
        if task == "beta":
            fix = write(f"{work}/beta.txt", "beta\n")
            return [{**fix, "wait_for": str(self.gate)}, {"text": "Summary: beta fixed."}]
        return [  # gamma: never right, and tries to commit on its own
            {"tool_calls": [{"name": "Bash", "input": {"command": "git commit -am sneaky"}}]},
            write(f"{work}/gamma.txt", "nope\n"),
            {"text": "Summary: gamma attempted."},
        ]


EPIC = """\
name: demo
council: {judges: 1, roles: [judge]}
tasks:
  - id: alpha
    role: coder
    prompt: Write alpha.txt holding the line alpha.
    checks: ["grep -qx alpha alpha.txt"]
  - id: beta
    role: coder
    prompt: Write beta.txt holding the line beta.
    checks: ["grep -qx beta beta.txt"]
  - id: gamma
    role: coder
    prompt: Write gamma.txt holding the line gamma.
    checks: ["echo token $CORRAL_TEST_API_KEY", "grep -qx gamma gamma.txt"]
"""


def config(url: str) -> str:
    return f"""
scheduler:
  poll_interval_s: 0.2
roles:
  default:
    retry: {{base_s: 0.05, cap_s: 0.2}}
  coder:
    worker: claude-code
    concurrency: 4
    tools: ["Read", "Write(./**)", "Bash(git *)"]
    limits: {{max_attempts: 1, timeout_s: 120, grace_s: 2}}
  judge:
    worker: claude-code
    concurrency: 4
    tools: ["Read", "Write(./**)"]
    limits: {{max_attempts: 1, timeout_s: 120, grace_s: 2}}
environments:
  local:
    max_inflight: 8
workers:
  claude-code:
    binary: {CLAUDE}
    version: 2.1.330
    summary_grace_s: 1
    env: {{ANTHROPIC_BASE_URL: "{url}", ANTHROPIC_API_KEY: "{API_KEY}"}}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def new_repo(repo: Path, readme: str) -> Path:
    """A git repository on `main` with one commit (a README holding `readme`)."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text(readme)
    git(repo, "add", "README")
    git(repo, "-c", "user.name=Dev", "-c", "user.email=dev@example.com", "commit", "-qm", "init")
    return repo


@pytest.fixture
def epic_env(tmp_path: Path, clis: None) -> Iterator[tuple[Corral, RoutedMock, Path]]:
    mock = RoutedMock(tmp_path / "beta-may-go").start()
    c = Corral(tmp_path, config(mock.url))
    repo = new_repo(tmp_path / "repo", "demo\n")
    try:
        yield c, mock, repo
    finally:
        c.stop_all()
        mock.close()


def test_an_epic_ratchets_passing_work_strikes_a_failing_task_and_survives_a_sigkill(
    epic_env: tuple[Corral, RoutedMock, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, mock, repo = epic_env
    monkeypatch.setenv("CORRAL_TEST_API_KEY", SECRET)  # the engine's; a check prints it
    (c.work / "epic.yaml").write_text(EPIC)
    base = git(repo, "rev-parse", "HEAD")
    engine = c.serve()
    epic = c.ok("epic", "run", "epic.yaml", "--repo", str(repo)).strip()

    # Mid-wave 2: beta's retry has asked the model and waits; the engine dies with SIGKILL.
    try:
        eventually(
            lambda: mock.starts.get(("worker", "beta", "2")) == 1, timeout=120, what="beta's retry"
        )
    except AssertionError as err:  # what the epic and the model saw, to tell why
        shown = c.run("epic", "show", epic).stdout
        raise AssertionError(f"{err}\nmodel starts: {mock.starts}\n{shown}") from None
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    c.serve()
    # The next engine re-adopts the running worker (its tool calls are decided again), then
    # the model goes on; the epic's wave resumes from its checkpoint.
    beta = next(t for t in c.json("epic", "show", epic)["tasks"] if t["id"] == "beta")
    eventually(
        lambda: any(e["kind"] == "recovered" for e in c.job(beta["job_id"])["timeline"]),
        timeout=60,
        what="the next engine to re-adopt beta's worker",
    )
    mock.gate.touch()

    shown = eventually(
        lambda: (d := c.json("epic", "show", epic))["state"] != "running" and d,
        timeout=240,
        what="the epic to end",
    )
    conforms("EpicShow", shown)
    tasks = {t["id"]: t for t in shown["tasks"]}
    assert shown["state"] == "partial", shown
    assert (tasks["alpha"]["state"], tasks["alpha"]["attempts"]) == ("passed", 1)
    assert (tasks["beta"]["state"], tasks["beta"]["attempts"]) == ("passed", 2), tasks["beta"]
    assert (tasks["gamma"]["state"], tasks["gamma"]["attempts"]) == ("struck", 3)
    assert tasks["gamma"]["failures"] == 3
    assert "check `grep -qx gamma gamma.txt` exited 1" in tasks["gamma"]["verdict"]["why"]
    assert [c["output"] for c in tasks["gamma"]["verdict"]["checks"]] == ["token [REDACTED]\n", ""]
    assert SECRET not in json.dumps(shown)
    assert tasks["beta"]["verdict"]["council"] == "PASS"
    assert tasks["beta"]["verdict"]["judges"][0]["key_insight"] == "beta does what it says"
    assert [w["tasks"] for w in shown["waves"]] == [
        {"alpha": 1, "beta": 1, "gamma": 1},
        {"beta": 2, "gamma": 2},
        {"gamma": 3},
    ]
    assert shown["waves"][1]["results"] == {"beta": "passed", "gamma": "open"}

    # The epic branch: exactly the passing tasks' work, in order, committed by Corral.
    log = git(repo, "log", "--reverse", "--format=%an <%ae>|%cn|%s", f"{base}..epic/demo")
    assert log.splitlines() == [
        "Corral <corral@localhost>|Corral|alpha: Write alpha.txt holding the line alpha.",
        "Corral <corral@localhost>|Corral|beta: Write beta.txt holding the line beta.",
    ]
    assert git(repo, "show", "epic/demo:alpha.txt") == "alpha"
    assert git(repo, "show", "epic/demo:beta.txt") == "beta"
    assert "gamma.txt" not in git(repo, "ls-tree", "--name-only", "epic/demo")
    assert git(repo, "rev-parse", "main") == base  # the target's own branch is untouched
    # Every try's worktree and branch went once its task settled: gamma's struck tries too.
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["epic/demo", "main"]

    # Fresh agents, each try once: no worker or judge started twice, the SIGKILL included.
    assert all(n == 1 for n in mock.starts.values()), mock.starts
    assert sorted(k for k in mock.starts if k[0] == "worker") == [
        ("worker", "alpha", "1"),
        ("worker", "beta", "1"),
        ("worker", "beta", "2"),
        ("worker", "gamma", "1"),
        ("worker", "gamma", "2"),
        ("worker", "gamma", "3"),
    ]
    assert sorted(k for k in mock.starts if k[0] == "judge") == [
        ("judge", "alpha", "1"),
        ("judge", "beta", "2"),
    ]
    jobs = c.json("jobs", "--limit", "100")
    assert len(jobs) == 8, [j["id"] for j in jobs]
    # Lead-only commits: gamma's `git commit` was refused by the _epic_worker guardrail.
    refusals = [
        b
        for r in mock.turn_requests
        for m in r["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result" and "only Corral commits"
        in json.dumps(b)
    ]  # fmt: skip
    assert refusals
    status = conforms("Epic", c.json("epic", "status"), many=True)
    assert [e["id"] for e in status] == [epic]
    assert "partial" in c.ok("epic", "status")
