"""Whose failure an attempt's end was (workers/faults.py), table-tested; the agent cases read
the real CLIs' recorded output when their model API fails (tests/fixtures/agent-cli/)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from corral.domain.models import AttemptResult
from corral.domain.states import Fault, Outcome
from corral.workers.agents.base import agent_error
from corral.workers.faults import agent_fault, api_fault, command_fault
from corral.workers.streams import (
    ClaudeStreamParser,
    CodexStreamParser,
    OpenCodeStreamParser,
    StreamParser,
    StreamSummary,
    ToolCall,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "agent-cli"


def res(
    outcome: Outcome = Outcome.EXITED,
    code: int | None = 1,
    sig: int | None = None,
    error: str | None = None,
) -> AttemptResult:
    return AttemptResult(outcome=outcome, exit_code=code, signal=sig, error=error)


@pytest.mark.parametrize(
    ("result", "fault"),
    [
        (res(code=0), None),
        (res(code=3), Fault.JOB),  # the command's own exit
        (res(code=2), Fault.JOB),  # `make report` without a Makefile
        (res(code=None, sig=9), Fault.JOB),  # its own process died of a signal (OOM, kill -9)
        (res(Outcome.TIMED_OUT, None), Fault.JOB),  # `sleep 60` with --timeout 5
        (res(Outcome.SPAWN_ERROR, None, error="exec: No such file or directory"), Fault.JOB),
        (res(Outcome.SPAWN_ERROR, None, error="chdir: Permission denied"), Fault.JOB),
        (
            res(Outcome.SPAWN_ERROR, None, error="fork: Resource temporarily unavailable"),
            Fault.WORKER,
        ),
        (res(Outcome.SPAWN_ERROR, None, error="cannot start corral-shim for /x: …"), Fault.WORKER),
        (res(Outcome.LOST, None, error="shim vanished without a result"), Fault.WORKER),
        (res(Outcome.CANCELLED, None), None),
        (res(Outcome.KILLED, None), None),
    ],
)
def test_command_fault(result: AttemptResult, fault: Fault | None) -> None:
    assert command_fault(result) is fault


@pytest.mark.parametrize(
    ("status", "message", "fault"),
    [
        (401, "Failed to authenticate", Fault.CONFIG),
        (403, "forbidden", Fault.CONFIG),
        (None, "Not logged in · Please run /login", Fault.CONFIG),
        (None, "Missing environment variable: `OPENAI_API_KEY`.", Fault.CONFIG),
        (404, "There's an issue with the selected model (x).", Fault.CONFIG),
        (None, "model gpt-9 does not exist", Fault.CONFIG),
        (429, "rate limited", Fault.WORKER),
        (408, "request timeout", Fault.WORKER),
        (500, "api_error", Fault.WORKER),
        (529, "overloaded", Fault.WORKER),
        (
            503,
            "invalid api key upstream",
            Fault.WORKER,
        ),  # a 5xx is the provider's, whatever it says
        (None, "stream disconnected before completion", Fault.WORKER),
        (None, None, Fault.WORKER),
        (400, "prompt is too long", Fault.JOB),
        (413, "request too large", Fault.JOB),
    ],
)
def test_api_fault(status: int | None, message: str | None, fault: Fault) -> None:
    assert api_fault(status, message) is fault


def summary(**kw: object) -> StreamSummary:
    return StreamSummary(session_id=None, model=None, cli_version=None, **kw)  # type: ignore[arg-type]


CALL = ToolCall(id="t1", tool="Bash", finished=False)


@pytest.mark.parametrize(
    ("result", "stream", "fault"),
    [
        (res(code=0), summary(succeeded=True, results_seen=1), None),
        (res(code=1), None, Fault.WORKER),  # the CLI wrote nothing
        (res(code=139), summary(), Fault.WORKER),  # crashed before any result
        (res(code=1), summary(results_seen=1, error_subtype="error_max_turns"), Fault.JOB),
        (res(code=1), summary(results_seen=1, api_failed=True, api_error_status=500), Fault.WORKER),
        (res(code=1), summary(results_seen=1, api_failed=True, api_error_status=401), Fault.CONFIG),
        (res(code=1), summary(results_seen=1, api_failed=True, api_error_status=400), Fault.JOB),
        # the deadline: before any answer the model is to blame, after one the job
        (res(Outcome.TIMED_OUT, None), summary(), Fault.WORKER),
        (res(Outcome.TIMED_OUT, None), summary(tokens_out=40), Fault.JOB),
        (res(Outcome.TIMED_OUT, None), summary(tool_calls=(CALL,)), Fault.JOB),
        (
            res(Outcome.TIMED_OUT, None),
            summary(tokens_out=40, api_retrying=True, api_error_status=529),
            Fault.WORKER,
        ),
        (res(Outcome.LOST, None), summary(), Fault.WORKER),
        (res(Outcome.SPAWN_ERROR, None, error="exec: No such file"), None, Fault.WORKER),
        (res(Outcome.CANCELLED, None), summary(), None),
    ],
)
def test_agent_fault(
    result: AttemptResult, stream: StreamSummary | None, fault: Fault | None
) -> None:
    assert agent_fault(result, stream) is fault


def parse(make: Callable[[], StreamParser], path: str, exit_code: int = 1) -> StreamSummary:
    parser = make()
    for line in (FIXTURES / path).read_bytes().splitlines(keepends=True):
        parser.feed(line, 0.0)
    return parser.finish(exit_code, 0.0)


def codex() -> StreamParser:
    return CodexStreamParser(model="gpt-5.5")


C330, CODEX, OC = (
    "claude-code-2.1.330/stream-json",
    "codex-0.169.0/exec-json",
    "opencode-1.18.33/run-format-json",
)


@pytest.mark.parametrize(
    ("make", "path", "status", "fault", "error"),
    [
        (
            ClaudeStreamParser,
            f"{C330}_api-error-401.jsonl",
            401,
            Fault.CONFIG,
            "agent failed (api_error, HTTP 401): Failed to authenticate. API Error: 401 mock 401 "
            "authentication_error [not retried: fix the worker's credentials or model]",
        ),
        (
            ClaudeStreamParser,
            f"{C330}_not-logged-in.jsonl",
            None,
            Fault.CONFIG,
            "agent failed (api_error): Not logged in · Please run /login [not retried: fix the "
            "worker's credentials or model]",
        ),
        (ClaudeStreamParser, f"{C330}_api-error-404.jsonl", 404, Fault.CONFIG, None),
        (
            ClaudeStreamParser,
            f"{C330}_api-error-429.jsonl",
            429,
            Fault.WORKER,
            "agent failed (api_error, HTTP 429): API Error: Request rejected (429) · mock 429 "
            "rate_limit_error",
        ),
        (ClaudeStreamParser, f"{C330}_api-error-500.jsonl", 500, Fault.WORKER, None),
        (ClaudeStreamParser, f"{C330}_api-error-529.jsonl", 529, Fault.WORKER, None),
        (codex, f"{CODEX}_api-error-401.jsonl", 401, Fault.CONFIG, None),
        (
            codex,
            f"{CODEX}_api-error-429.jsonl",
            429,
            Fault.WORKER,
            "agent failed (turn_failed, HTTP 429): exceeded retry limit, last status: 429 Too Many "
            "Requests",
        ),
        (codex, f"{CODEX}_api-error-500.jsonl", None, Fault.WORKER, None),
        (codex, f"{CODEX}_missing-api-key.jsonl", None, Fault.CONFIG, None),
        (
            OpenCodeStreamParser,
            f"{OC}_api-error-401.jsonl",
            401,
            Fault.CONFIG,
            "agent failed (APIError, HTTP 401): mock 401 [not retried: fix the worker's "
            "credentials or model]",
        ),
    ],
)
def test_a_failing_model_api_is_the_workers_fault(
    make: Callable[[], StreamParser], path: str, status: int | None, fault: Fault, error: str | None
) -> None:
    s = parse(make, path)
    assert (s.api_failed, s.api_error_status, s.succeeded) == (True, status, False)
    got = agent_fault(res(code=1), s)
    assert got is fault
    if error is not None:
        assert agent_error(s, got) == error


@pytest.mark.parametrize(
    "path",
    [
        "claude-code-2.1.197/stream-json_error_max_turns.jsonl",
        "claude-code-2.1.197/stream-json_error_max_budget_usd.jsonl",
    ],
)
def test_the_agents_own_verdict_is_the_jobs(path: str) -> None:
    s = parse(ClaudeStreamParser, path)
    assert not s.api_failed and agent_fault(res(code=1), s) is Fault.JOB
    assert agent_error(s, Fault.JOB).startswith("agent failed (error_max_")
