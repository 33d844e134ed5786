"""The governor in process: the hook protocol, fail-closed answers, budgets that survive a
restart, checkpoints, and the AgentEvent built from durable records. The last tests run the
real `corral-hook` binary against it."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.domain.errors import StoreError
from corral.domain.models import AttemptResult, Job, Limits
from corral.domain.settings import EnvSpec, RoleSpec, Settings
from corral.domain.states import Outcome
from corral.runtime.governor import Governor
from corral.store.memory import MemoryStore
from corral.workers.agents.base import governance_socket
from corral.workers.native import hook_path
from corral.workers.process import STDOUT
from tests.contract.test_store_contract import claim, make_job

SETTINGS = Settings(
    roles={"agent": RoleSpec(name="agent", worker="claude-code", tools=("Bash(ls *)", "Read"))},
    environments={"local": EnvSpec(name="local")},
)


TWO_CALLS = Limits(max_tool_calls=2)


class Harness:
    def __init__(self, tmp: Path, limits: Limits = TWO_CALLS) -> None:
        self.store = MemoryStore()
        self.tmp = tmp
        job = make_job(role="agent", worker="claude-code", limits=limits)
        c = claim(job)
        attempt_dir = tmp / "attempts" / f"{job.id}.1"
        attempt_dir.mkdir(parents=True)
        (attempt_dir / STDOUT).write_bytes(b"")
        self.claimed = replace(c, attempt=replace(c.attempt, dir=str(attempt_dir)))
        self.stops: list[tuple[str, str, float]] = []
        self.governor = self.new_governor()

    def new_governor(self) -> Governor:
        async def stop(job_id: str, limit: str, grace: float) -> None:
            self.stops.append((job_id, limit, grace))

        return Governor(
            store=self.store,
            settings=SETTINGS,
            data_dir=self.tmp,
            adapter_of=lambda kind: kind,
            live=lambda job_id: self.claimed if job_id == self.claimed.job.id else None,
            stop=stop,
        )

    def request(
        self,
        payload: dict[str, Any],
        *,
        cli: str = "claude-code",
        token: str | None = None,
        ref: str | None = None,
    ) -> bytes:
        header = {
            "op": "hook",
            "attempt": ref or f"{self.claimed.job.id}.1",
            "token": token or self.claimed.permit.id,
            "cli": cli,
        }
        return json.dumps(header).encode() + b"\n" + json.dumps(payload).encode()

    def ask(self, payload: dict[str, Any], **kw: Any) -> tuple[int, str]:
        return anyio.run(self.governor.answer, self.request(payload, **kw))


def pre(command: str, call_id: str = "toolu_1") -> dict[str, Any]:
    return {
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "session_id": "s-1",
        "tool_input": {"command": command},
        "tool_use_id": call_id,
    }


def test_claude_gets_a_json_decision_and_others_an_exit_code(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    code, text = h.ask(pre("ls -la"))
    assert code == 0
    assert json.loads(text)["hookSpecificOutput"]["permissionDecision"] == "allow"
    code, text = h.ask(pre("rm -rf /"))
    out = json.loads(text)["hookSpecificOutput"]
    assert (code, out["permissionDecision"]) == (0, "deny")
    assert "outside this role's scope" in out["permissionDecisionReason"]
    assert h.ask(pre("ls", "c3"), cli="codex") == (2, h.ask(pre("ls"), cli="codex")[1])


def test_the_ceiling_is_read_only_for_an_allowed_call_and_a_failed_read_spends_nothing(
    tmp_path: Path,
) -> None:
    """The budget ceiling is a store read the decision asks for only when the scope and the
    guardrails allow a call of an attempt that has cost something; when that read fails the
    call is denied (fail closed: `_connection`) and was no use of the tool-call budget."""
    h = Harness(tmp_path)
    reads: list[float] = []
    failing = [True]

    async def overrun(job: Job, cost: float, now: float) -> bool:
        reads.append(cost)
        if failing[0]:
            raise StoreError("the store is away")
        return False

    h.governor.overrun = overrun
    anyio.run(h.governor.started, h.claimed)
    [monitor] = h.governor._monitors.values()
    monitor.cost_usd = 0.25
    assert h.ask(pre("cat x", "a"), cli="codex")[0] == 2  # out of scope: no read
    assert reads == []
    with pytest.raises(StoreError):  # the socket's side answers it with a denial
        h.ask(pre("ls", "b"), cli="codex")
    assert reads == [0.25]
    failing[0] = False
    assert h.ask(pre("ls", "c"), cli="codex")[0] == 0  # the failed call spent nothing
    code, text = h.ask(pre("ls", "d"), cli="codex")
    assert code == 2 and "tool-call budget (2) is spent" in text


@pytest.mark.parametrize(
    "bad",
    [
        {"token": "forged"},
        {"ref": "nope.1"},
        {"ref": "x"},
    ],
)
def test_a_request_for_no_live_attempt_is_denied(tmp_path: Path, bad: dict[str, str]) -> None:
    h = Harness(tmp_path)
    code, text = h.ask(pre("ls"), **bad)
    assert code == 2 and "not a live attempt" in text


def test_a_malformed_request_is_denied(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    for data in (b"", b"not json\n{}", b'{"op":"hook"}\n[1]'):
        code, _ = anyio.run(h.governor.answer, data)
        assert code == 2


def test_the_budget_stops_the_attempt_and_survives_a_governor_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    assert h.ask(pre("ls", "a"), cli="codex")[0] == 0
    h.governor = h.new_governor()  # an engine restart: the count comes back from the store
    assert h.ask(pre("cat x", "b"), cli="codex")[0] == 2  # out of scope still spends a call
    code, text = h.ask(pre("ls", "c"), cli="codex")
    assert code == 2 and "tool-call budget (2) is spent" in text
    assert h.stops == [(h.claimed.job.id, "max_tool_calls", 5.0)]
    reasons = [e.reason for e in anyio.run(h.store.policy_evaluations, h.claimed.job.id)]
    assert reasons == ["allowed", "out_of_scope", "max_tool_calls"]


def test_tokens_read_from_the_stream_are_held_to_the_budget(tmp_path: Path) -> None:
    h = Harness(tmp_path, Limits(token_budget_out=50))
    fixture = Path("tests/fixtures/agent-cli/claude-code-2.1.197/stream-json_basic.jsonl")
    Path(h.claimed.attempt.dir, STDOUT).write_bytes(fixture.read_bytes())  # 150 tokens out
    code, text = h.ask(pre("ls"), cli="opencode")
    assert code == 2 and "token_budget_out" in text
    assert h.stops[0][1] == "token_budget_out"


def test_post_tool_use_checkpoints_and_the_trace_is_built_from_records(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.ask(pre("ls", "toolu_ok"))
    h.ask(
        {
            "hook_event_name": "PostToolUse",
            "tool_name": "Bash",
            "session_id": "s-1",
            "tool_use_id": "toolu_ok",
            "tool_response": {"stdout": "a.txt"},
            "duration_ms": 7,
        }
    )
    h.ask(pre("rm -rf /", "toolu_no"))
    [cp] = anyio.run(h.store.checkpoints, h.claimed.job.id)
    assert (cp.session_id, cp.tool_call_count, cp.last_tool, cp.call_id, cp.duration_ms) == (
        "s-1",
        1,
        "Bash",
        "toolu_ok",
        7,
    )
    assert cp.last_output_digest and len(cp.last_output_digest) == 64
    result = AttemptResult(
        outcome=Outcome.EXITED, exit_code=0, started_at=time.time() - 1, ended_at=time.time()
    )
    anyio.run(h.governor.ended, h.claimed, result)
    [event] = anyio.run(h.store.agent_events, h.claimed.job.id)
    # No stream was written: every evaluated call still appears (as Codex would leave it).
    assert [(t.tool, t.denied, t.call_id) for t in event.tool_calls] == [
        ("Bash", True, "toolu_no"),
        ("Bash", False, "toolu_ok"),
    ]
    assert event.checkpoint_count == 1 and event.retry_count == 0
    assert 900 <= (event.duration_ms or 0) <= 1500


def test_the_hook_binary_relays_decisions_and_fails_closed(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    sock = governance_socket(tmp_path)
    hook = str(hook_path())
    args = [hook, str(sock), f"{h.claimed.job.id}.1", h.claimed.permit.id, "codex", "2000"]

    def run(payload: dict[str, Any], argv: list[str] = args) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, input=json.dumps(payload), capture_output=True, text=True, timeout=10
        )

    # Nobody listening: denied (exit 2), with the reason on stderr.
    down = run(pre("ls"))
    assert down.returncode == 2 and "fail-closed" in down.stderr

    async def serve_and_ask() -> list[subprocess.CompletedProcess[str]]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.governor.serve)
            while not sock.exists():
                await anyio.sleep(0.01)
            out = [
                await anyio.to_thread.run_sync(run, pre("ls", "x1")),
                await anyio.to_thread.run_sync(run, pre("rm -rf /", "x2")),
            ]
            tg.cancel_scope.cancel()
        return out

    allowed, denied = anyio.run(serve_and_ask)
    assert (allowed.returncode, allowed.stdout) == (0, "")
    assert denied.returncode == 2 and "outside this role's scope" in denied.stderr
    bad_args = run(pre("ls"), [hook, str(sock), "a b", "t", "codex"])
    assert bad_args.returncode == 2


def test_a_governor_that_never_answers_times_out_into_a_denial(tmp_path: Path) -> None:
    import socket as so

    path = tmp_path / "silent.sock"
    server = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        started = time.monotonic()
        r = subprocess.run(
            [str(hook_path()), str(path), "j.1", "t", "claude-code", "300"],
            input="{}",
            capture_output=True,
            text=True,
            timeout=10,
        )
        took = time.monotonic() - started
    finally:
        server.close()
    assert r.returncode == 2 and "timed out" in r.stderr
    assert took < 2.0


def test_a_request_read_after_the_hook_gave_up_is_recorded_as_its_denial(tmp_path: Path) -> None:
    """An engine stalled past the hook's timeout reads the request late: the hook has already
    denied the call, so the record says so, and the call is not a use of the budget."""
    import socket as so

    h = Harness(tmp_path)
    path = tmp_path / "stalled.sock"
    server = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        r = subprocess.run(
            [
                str(hook_path()),
                str(path),
                f"{h.claimed.job.id}.1",
                h.claimed.permit.id,
                "codex",
                "200",
            ],
            input=json.dumps(pre("ls", "late")),
            capture_output=True,
            text=True,
            timeout=10,
        )
        conn, _ = server.accept()  # the engine wakes up: the request waits in the socket
        with conn:
            stale = b""
            while chunk := conn.recv(65536):
                stale += chunk
    finally:
        server.close()
    assert r.returncode == 2 and "timed out" in r.stderr
    assert json.loads(stale.partition(b"\n")[0])["deadline_ms"] > 0
    code, text = anyio.run(h.governor.answer, stale)
    assert code == 2 and "gave up waiting" in text
    # Both calls of the budget are still there: the late one was never a use.
    assert h.ask(pre("ls", "a"), cli="codex")[0] == 0
    h.governor = h.new_governor()  # and a restart counts it the same way
    assert h.ask(pre("ls", "b"), cli="codex")[0] == 0
    evaluations = anyio.run(h.store.policy_evaluations, h.claimed.job.id)
    assert [(e.verdict, e.reason) for e in evaluations] == [
        ("deny", "hook_timeout"),
        ("allow", "allowed"),
        ("allow", "allowed"),
    ]


def test_a_call_to_a_tool_the_model_was_never_offered_is_shown_refused(tmp_path: Path) -> None:
    """Claude Code offers only the scope's tools (--tools): a call to another one was refused by
    the CLI and ran nothing, so the trace shows it refused, not "ok"."""
    h = Harness(tmp_path)
    fixture = Path("tests/fixtures/agent-cli/claude-code-2.1.197/stream-json_basic.jsonl")
    stream = fixture.read_text().replace('"name":"Read"', '"name":"Write"')
    Path(h.claimed.attempt.dir, STDOUT).write_text(stream)
    result = AttemptResult(
        outcome=Outcome.EXITED, exit_code=0, started_at=time.time() - 1, ended_at=time.time()
    )
    anyio.run(h.governor.ended, h.claimed, result)
    [event] = anyio.run(h.store.agent_events, h.claimed.job.id)
    shown = {t.tool: (t.denied, t.reason) for t in event.tool_calls}
    assert shown["Bash"] == (False, None)
    assert shown["Write"][0] is True and "never offered" in str(shown["Write"][1])


def test_every_allowed_call_is_in_the_trace_even_one_the_cli_wrote_no_item_for(
    tmp_path: Path,
) -> None:
    """An attempt stopped right after its hook allowed a call leaves no item for it in the
    stream: the trace still lists it, as many calls as were evaluated."""
    h = Harness(tmp_path, Limits(max_tool_calls=5))
    fixture = Path("tests/fixtures/agent-cli/claude-code-2.1.197/stream-json_basic.jsonl")
    bash_id = "toolu_01f2a778f68c5149bebfff5d"
    read_id = "toolu_0194cbdf53e716449fae991d"  # the Read call: gone from this stream
    lines = [line for line in fixture.read_text().splitlines() if read_id not in line]
    Path(h.claimed.attempt.dir, STDOUT).write_text("\n".join(lines) + "\n")
    assert bash_id in Path(h.claimed.attempt.dir, STDOUT).read_text()
    assert h.ask(pre("ls", bash_id))[0] == 0
    assert h.ask(pre("ls -l", "toolu_never_written"))[0] == 0
    result = AttemptResult(
        outcome=Outcome.EXITED, exit_code=0, started_at=time.time() - 1, ended_at=time.time()
    )
    anyio.run(h.governor.ended, h.claimed, result)
    [event] = anyio.run(h.store.agent_events, h.claimed.job.id)
    assert [(t.call_id, t.denied) for t in event.tool_calls] == [
        (bash_id, False),
        ("toolu_never_written", False),
    ]
    assert event.tool_calls[1].input == {"command": "ls -l"}
