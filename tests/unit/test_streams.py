"""Stream parsers against the recorded CLI outputs (tests/fixtures/agent-cli/).

Each fixture is fed all at once and line by line on a fake clock; the figures asserted are the
ones the recordings hold (tokens, cost, session id, tool calls, the run's verdict). Exit codes
are the ones the reference observed for each scenario. Volatile fields (ids, paths, durations)
are normalised wherever two runs are compared.

By hand: `.venv/bin/python -m tests.unit.test_streams` prints each parser's throughput.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from corral.workers.streams import (
    ClaudeStreamParser,
    CodexStreamParser,
    OpenCodeStreamParser,
    StreamEvent,
    StreamOptions,
    StreamParser,
    StreamSummary,
    ToolCall,
    cost_of,
)
from corral.workers.streams.claude import is_denial_text
from corral.workers.streams.prices import Price, PriceTable

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "agent-cli"
C197, C330 = "claude-code-2.1.197/stream-json", "claude-code-2.1.330/stream-json"
CODEX, OC = "codex-0.169.0", "opencode-1.18.33/run-format-json"
BASIC_TEXT = "The directory contains hello.txt, which says hello world."
HOOKED = (("Bash", "ok"), ("Bash", "denied"), ("Bash", "denied"), ("Bash", "error"), ("Read", "ok"))


def claude() -> StreamParser:
    return ClaudeStreamParser()


def codex(base: tuple[int, int, int] = (0, 0, 0)) -> Callable[[], StreamParser]:
    return lambda: CodexStreamParser(
        model="gpt-5",
        baseline_tokens_in=base[0],
        baseline_tokens_out=base[1],
        baseline_cached_in=base[2],
    )


def opencode() -> StreamParser:
    return OpenCodeStreamParser()


@dataclass(frozen=True)
class Case:
    path: str
    make: Callable[[], StreamParser]
    exit_code: int
    session_id: str
    tools: tuple[tuple[str, str], ...]  # (tool, "ok" | "error" | "denied" | "open")
    tokens: tuple[int, int, int]  # in, out, cached
    cost: float | None
    succeeded: bool
    results: int
    final_text: str | None
    error_subtype: str | None = None
    terminal_reason: str | None = "completed"
    denied: int = 0
    warnings: int = 0
    source: str | None = "cli"


CASES = [
    Case(
        f"{C197}_basic.jsonl",
        claude,
        0,
        "774427a5-10a4-4e04-9905-477aa87158bf",
        (("Bash", "ok"), ("Read", "ok")),
        (3900, 150, 0),
        0.01395,
        True,
        1,
        BASIC_TEXT,
    ),
    Case(
        f"{C330}_basic.jsonl",
        claude,
        0,
        "ef1e52c5-5d11-40df-8e5e-15083031e641",
        (("Bash", "ok"), ("Read", "ok")),
        (3900, 150, 0),
        0.01395,
        True,
        1,
        BASIC_TEXT,
    ),
    Case(
        f"{C197}_include-partial-messages.jsonl",
        claude,
        0,
        "b7f8d508-c892-45c8-a4a4-a74e1fb1fbfb",
        (("Bash", "ok"), ("Read", "ok")),
        (3900, 150, 0),
        0.01395,
        True,
        1,
        BASIC_TEXT,
    ),
    Case(
        f"{C197}_permission_denials.jsonl",
        claude,
        0,
        "efbb45dd-49db-4944-974b-36a08ff66db3",
        (("Bash", "denied"),) * 4 + (("Bash", "ok"), ("Bash", "denied")),
        (10500, 490, 0),
        0.03885,
        True,
        1,
        "done",
        denied=5,
    ),
    Case(
        f"{C197}_error_max_turns.jsonl",
        claude,
        1,
        "4dbeb796-49bb-459e-8f01-7b7b09c4851a",
        (("Bash", "ok"),),
        (1200, 40, 0),
        0.0042,
        False,
        1,
        "I'll list the files.",
        "error_max_turns",
        "max_turns",
    ),
    # `usage` is all zeros here; the tokens are in `modelUsage`
    Case(
        f"{C197}_error_max_budget_usd.jsonl",
        claude,
        1,
        "4f4561d1-16db-4b63-a11b-db56baf0c51a",
        (("Bash", "open"),),
        (1200, 40, 0),
        0.0042,
        False,
        1,
        "I'll list the files.",
        "error_max_budget_usd",
        None,
    ),
    Case(
        f"{C197}_sigint_error_during_execution.jsonl",
        claude,
        1,
        "468c6900-8df7-47f2-807f-926239d04d2d",
        (("Bash", "error"),),
        (1200, 40, 0),
        0.0042,
        False,
        1,
        None,
        "error_during_execution",
        "aborted_tools",
    ),
    # 2.1.330 exits 0 after SIGINT, but its result says error
    Case(
        f"{C330}_sigint.jsonl",
        claude,
        0,
        "007b1487-318d-42f2-a187-4f9833fd5d05",
        (("Bash", "error"),),
        (1200, 40, 0),
        0.0042,
        False,
        1,
        None,
        "error_during_execution",
        "aborted_tools",
    ),
    # no result: live tokens (output under-counted) priced from the table
    Case(
        f"{C197}_sigterm_no_result.jsonl",
        claude,
        143,
        "c9a480a4-4c1a-441b-b4d4-31157eaff7dd",
        (("Bash", "open"),),
        (1200, 1, 0),
        0.003615,
        False,
        0,
        None,
        None,
        None,
        source="price_table",
    ),
    Case(
        f"{C330}_subagent_two-results.jsonl",
        claude,
        0,
        "84a108f0-3d75-4684-906c-533a1aac6195",
        (("Agent", "ok"), ("Agent", "ok")),
        (11400, 420, 0),
        0.0405,
        True,
        2,
        "ok",
        denied=1,
    ),
    Case(
        f"{C197}-input_two-turns.out.jsonl",
        claude,
        0,
        "6b5ba819-c20d-49a6-8713-2c3ef91a9388",
        (),
        (2500, 90, 0),
        0.00885,
        True,
        2,
        "second answer after resume",
    ),
    Case(
        f"{C197}_include-hook-events.jsonl",
        claude,
        0,
        "5cf56d92-5e2e-49c9-8aba-a37a2825561c",
        HOOKED,
        (8700, 390, 0),
        0.03195,
        True,
        1,
        "done",
        denied=2,
    ),
    Case(
        f"{C330}_hooks-via--settings-flag.jsonl",
        claude,
        0,
        "1dc40a07-48e8-43f3-9040-75eb9d309350",
        HOOKED,
        (8700, 390, 0),
        0.03195,
        True,
        1,
        "done",
        denied=2,
    ),
    Case(
        f"{C330}_http-hook-deny.jsonl",
        claude,
        0,
        "81c6594f-fdcb-4da3-9764-f90676b39b1e",
        HOOKED,
        (8700, 390, 0),
        0.03195,
        True,
        1,
        "done",
        denied=2,
    ),
    # continue:false is a stop, not a success, though subtype says "success"
    Case(
        f"{C330}_hook-deny-plus-continue-false.jsonl",
        claude,
        0,
        "16723d21-27e6-45ed-82fa-bcaf32f71460",
        (("Bash", "denied"),),
        (1200, 40, 0),
        0.0042,
        False,
        1,
        "",
        None,
        "hook_stopped",
        denied=1,
    ),
    Case(
        f"{C197}_hook-continue-false.jsonl",
        claude,
        0,
        "f4d15e85-45c4-4474-ba05-337d48ecec0b",
        (("Bash", "ok"),),
        (1200, 40, 0),
        0.0042,
        False,
        1,
        "",
        None,
        "hook_stopped",
    ),
    Case(
        f"{C330}_hook-failure_slow-block.jsonl",
        claude,
        0,
        "9984e621-be46-4281-8077-e80b7dbf7d0e",
        (("Bash", "denied"),),
        (2500, 90, 0),
        0.00885,
        True,
        1,
        "done",
        denied=1,
    ),
    Case(
        f"{C330}_hook-failure_crash-block.jsonl",
        claude,
        0,
        "5babd0fd-4019-473c-bc76-149750abfd2e",
        (("Bash", "ok"),),
        (2500, 90, 0),
        0.00885,
        True,
        1,
        "done",
    ),
    Case(
        f"{CODEX}/exec-json_minimal.jsonl",
        codex(),
        0,
        "01a200c9-0433-7792-bd52-a77bf2f2748f",
        (),
        (2000, 60, 0),
        0.0031,
        True,
        1,
        "probe",
        None,
        None,
        warnings=1,
        source="price_table",
    ),
    Case(
        f"{CODEX}/exec-json_commands_file_change.jsonl",
        codex(),
        0,
        "01a200c9-322f-7293-b43b-a214fe058903",
        (("exec_command", "ok"), ("file_change", "ok"), ("exec_command", "error")),
        (8900, 270, 3072),
        0.010369,
        True,
        1,
        "Done: listed files, added new.txt.",
        None,
        None,
        warnings=1,
        source="price_table",
    ),
    Case(
        f"{CODEX}/exec-json_sigterm.jsonl",
        codex(),
        143,
        "01a200c9-7f27-7d02-8658-0c75c0d8ad7d",
        (("exec_command", "open"),),
        (0, 0, 0),
        None,
        False,
        0,
        None,
        None,
        None,
        warnings=1,
        source=None,
    ),
    # resumed thread: usage is cumulative, minus the commands run's totals (the baseline)
    Case(
        f"{CODEX}/exec-resume-json.jsonl",
        codex((8900, 270, 3072)),
        0,
        "01a200c9-322f-7293-b43b-a214fe058903",
        (),
        (2450, 75, 1536),
        0.0020845,
        True,
        1,
        "ok",
        None,
        None,
        warnings=1,
        source="price_table",
    ),
    # two more commands were blocked by a hook: they emit no item
    Case(
        f"{CODEX}/exec-json_with-hooks-blocking.jsonl",
        codex(),
        0,
        "01a200c9-c3c1-7bd0-bea6-a65d56fb3681",
        (("exec_command", "ok"),),
        (8900, 270, 3072),
        0.010369,
        True,
        1,
        "done",
        None,
        None,
        warnings=3,
        source="price_table",
    ),
    Case(
        f"{OC}_basic.jsonl",
        opencode,
        0,
        "ses_dff35f0e1ffebFsrS2YCzm0RBs",
        (("bash", "ok"), ("read", "ok")),
        (6450, 195, 1536),
        0.0082845,
        True,
        1,
        "hello.txt says hello world.",
        None,
        "stop",
    ),
    # the run never reached a "stop" step
    Case(
        f"{OC}_permissions.jsonl",
        opencode,
        0,
        "ses_dff35c0a4ffe2Vo46uMSaXjdXU",
        (("bash", "ok"),) + (("bash", "denied"),) * 3,
        (8900, 270, 3072),
        0.010369,
        False,
        0,
        None,
        None,
        "tool-calls",
        denied=3,
    ),
    Case(
        f"{OC}_sigterm.jsonl",
        opencode,
        143,
        "ses_dff359a32ffeGvr1oAtKkTtfDK",
        (),
        (0, 0, 0),
        None,
        False,
        0,
        None,
        None,
        None,
        source=None,
    ),
]


def read(path: str) -> bytes:
    return (FIXTURES / path).read_bytes()


def lines(path: str) -> list[bytes]:
    return read(path).splitlines(keepends=True)


def feed_lines(parser: StreamParser, raw: list[bytes], step: float = 0.25) -> list[StreamEvent]:
    """Feed line by line on a fake clock that advances `step` seconds a line."""
    events: list[StreamEvent] = []
    for i, line in enumerate(raw):
        events += parser.feed(line, i * step)
    return events


def state(call: ToolCall) -> str:
    if not call.finished:
        return "open"
    return "denied" if call.denied else "error" if call.is_error else "ok"


def normalised(summary: StreamSummary) -> StreamSummary:
    """Volatile fields out (session and call ids, inputs and outputs with their paths,
    clock-derived durations), for comparing two runs of one scenario."""
    ids = {c.id: f"call-{i}" for i, c in enumerate(summary.tool_calls)}
    calls = tuple(
        replace(
            c,
            id=ids[c.id],
            parent_id=ids.get(c.parent_id or ""),
            duration_ms=None,
            output=None,
            input={},
        )
        for c in summary.tool_calls
    )
    return replace(summary, session_id="<session>", tool_calls=calls)


def check(case: Case, summary: StreamSummary) -> None:
    tools = tuple((c.tool, state(c)) for c in summary.tool_calls)
    tokens = (summary.tokens_in, summary.tokens_out, summary.tokens_cached_in)
    assert (summary.session_id, tools, tokens) == (case.session_id, case.tools, case.tokens)
    assert summary.cost_usd == (None if case.cost is None else pytest.approx(case.cost, rel=1e-9))
    assert (summary.cost_source, summary.succeeded, summary.results_seen) == (
        case.source,
        case.succeeded,
        case.results,
    )
    assert (summary.final_text, summary.error_subtype, summary.terminal_reason) == (
        case.final_text,
        case.error_subtype,
        case.terminal_reason,
    )
    assert (summary.denied_calls, summary.warnings) == (case.denied, case.warnings)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.path)
def test_fixture_all_at_once(case: Case) -> None:
    parser = case.make()
    events = parser.feed(read(case.path), 0.0)
    check(case, parser.finish(case.exit_code, 1.0))
    assert Counter(e.kind for e in events)["warning"] == case.warnings


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.path)
def test_fixture_line_by_line_matches_all_at_once(case: Case) -> None:
    parser, whole = case.make(), case.make()
    events = feed_lines(parser, lines(case.path))
    summary = parser.finish(case.exit_code, 100.0)
    check(case, summary)
    whole.feed(read(case.path), 0.0)
    assert normalised(summary) == normalised(whole.finish(case.exit_code, 100.0))
    kinds = Counter(e.kind for e in events)
    assert kinds["session"] == 1
    assert kinds["tool_started"] == len(case.tools)
    assert kinds["tool_finished"] == sum(s != "open" for _, s in case.tools)
    assert kinds["result"] == case.results


def test_claude_versions_agree_once_ids_are_normalised() -> None:
    summaries = []
    for path in (f"{C197}_basic.jsonl", f"{C330}_basic.jsonl"):
        parser = ClaudeStreamParser()
        parser.feed(read(path), 0.0)
        summaries.append(replace(normalised(parser.finish(0, 0.0)), cli_version=None))
    assert summaries[0] == summaries[1]
    assert summaries[0].model == "claude-sonnet-4-5"


def test_claude_clock_durations_and_live_events() -> None:
    parser = ClaudeStreamParser()
    events = feed_lines(parser, lines(f"{C197}_basic.jsonl"))
    assert [e.kind for e in events] == [
        "session",
        "usage",
        "tool_started",
        "tool_finished",
        "usage",
        "tool_started",
        "tool_finished",
        "usage",
        "usage",
        "result",
    ]
    summary = parser.finish(0, 9.0)
    assert [c.duration_ms for c in summary.tool_calls] == [250, 250]  # one line apart
    assert summary.cli_version == "2.1.197"
    assert summary.tool_calls[0].input == {"command": "ls", "description": "List files"}
    assert summary.tool_calls[0].output == "hello.txt"


def test_claude_live_usage_from_partial_messages() -> None:
    parser = ClaudeStreamParser()
    events = feed_lines(parser, lines(f"{C197}_include-partial-messages.jsonl"))
    usage = [(e.tokens_in, e.tokens_out, e.final) for e in events if e.kind == "usage"]
    # message_start input, then message_delta output per message; the result agrees
    assert usage[:2] == [(1200, 1, False), (1200, 40, False)]
    assert usage[-2:] == [(3900, 150, False), (3900, 150, True)]


def test_claude_denial_known_live_or_only_from_the_result() -> None:
    parser = ClaudeStreamParser()
    events = feed_lines(parser, lines(f"{C197}_include-hook-events.jsonl"))
    live = [e.call.denied for e in events if e.kind == "tool_finished"]
    # 2.1.197 gives a JSON hook deny's reason bare: only permission_denials names it
    assert live == [False, False, True, False, False]
    assert [c.denied for c in parser.finish(0, 20.0).tool_calls] == [
        False,
        True,
        True,
        False,
        False,
    ]


def test_claude_two_results_last_cost_wins_and_denials_accumulate() -> None:
    raw = lines(f"{C330}_subagent_two-results.jsonl")
    results = [i for i, line in enumerate(raw) if json.loads(line)["type"] == "result"]
    assert len(results) == 2

    def with_cost(i: int, cost: float) -> bytes:
        obj = json.loads(raw[i])
        obj["total_cost_usd"] = cost
        return json.dumps(obj).encode() + b"\n"

    raw[results[0]] = with_cost(results[0], 0.001)
    parser = ClaudeStreamParser()
    parser.feed(b"".join(raw), 0.0)
    summary = parser.finish(0, 1.0)
    assert summary.cost_usd == 0.0405
    assert summary.denied_calls == 1  # from the first result; the second lists none
    # the Bash call a nested sub-agent was refused never appears as a tool_use line
    assert "toolu_01f6171637ee9f42788fa6d9" not in {c.id for c in summary.tool_calls}
    main, sub = summary.tool_calls
    assert (sub.parent_id, main.parent_id) == (main.id, None)
    assert (main.duration_ms, sub.duration_ms) == (5914, 3511)  # task_notification timing


def test_claude_killed_run_keeps_the_main_agents_last_words() -> None:
    raw = lines(f"{C330}_subagent_two-results.jsonl")[:24]  # SIGTERM before the results
    sub = json.loads(raw[19])
    assert sub["parent_tool_use_id"] is not None
    sub["message"]["content"][0]["text"] = "words of a sub-agent"
    raw[19] = json.dumps(sub).encode() + b"\n"
    parser = ClaudeStreamParser()
    parser.feed(b"".join(raw), 0.0)
    summary = parser.finish(143, 1.0)
    assert (summary.final_text, summary.results_seen, summary.succeeded) == ("main done", 0, False)


@pytest.mark.parametrize(
    ("path", "exit_code"),
    [
        (f"{C197}_basic.jsonl", 1),  # a success result is not enough …
        (f"{C197}_sigterm_no_result.jsonl", 0),  # … nor is exit 0 without a result
        (f"{C197}_basic.jsonl", -15),  # signal death as asyncio reports it
        (f"{C197}_basic.jsonl", None),  # exit status unknown
    ],
)
def test_claude_success_needs_both_result_and_exit_zero(path: str, exit_code: int | None) -> None:
    parser = ClaudeStreamParser()
    parser.feed(read(path), 0.0)
    assert parser.finish(exit_code, 1.0).succeeded is False


def test_claude_denial_from_tool_result_meta_whatever_the_text() -> None:
    raw = lines(f"{C330}_http-hook-deny.jsonl")
    obj = json.loads(raw[4])  # the hook's deny, with tool_result_meta decision "reject"
    obj["message"]["content"][0]["content"] = "a reason in words no rule of ours knows"
    parser = ClaudeStreamParser()
    events = parser.feed(b"".join(raw[:4]) + json.dumps(obj).encode(), 0.0)
    assert [e.call.denied for e in events if e.kind == "tool_finished"] == [False, True]


def test_claude_error_subtype_fails_even_without_is_error() -> None:
    raw = lines(f"{C197}_error_max_budget_usd.jsonl")
    result = json.loads(raw[-1])
    del result["is_error"]  # and this result has no terminal_reason either
    parser = ClaudeStreamParser()
    parser.feed(b"".join(raw[:-1]) + json.dumps(result).encode(), 0.0)
    summary = parser.finish(0, 1.0)
    assert (summary.succeeded, summary.error_subtype) == (False, "error_max_budget_usd")


def test_claude_session_from_any_line_and_no_double_count() -> None:
    raw = lines(f"{C197}_basic.jsonl")[1:]  # no init line
    parser = ClaudeStreamParser()
    events = feed_lines(parser, [line for line in raw for _ in (1, 2)])  # every line twice
    summary = parser.finish(0, 10.0)
    assert summary.session_id == "774427a5-10a4-4e04-9905-477aa87158bf"
    assert (summary.cli_version, summary.model) == (None, "claude-sonnet-4-5")
    assert len(summary.tool_calls) == 2
    assert Counter(e.kind for e in events)["tool_finished"] == 2
    assert (summary.tokens_in, summary.tokens_out, summary.results_seen) == (3900, 150, 2)


def test_codex_resume_baseline_chains_from_the_previous_summary() -> None:
    first = CodexStreamParser(model="gpt-5")
    first.feed(read(f"{CODEX}/exec-json_commands_file_change.jsonl"), 0.0)
    before = first.finish(0, 1.0)
    resumed = CodexStreamParser(
        model="gpt-5",
        baseline_tokens_in=before.tokens_in,
        baseline_tokens_out=before.tokens_out,
        baseline_cached_in=before.tokens_cached_in,
    )
    plain = CodexStreamParser(model="gpt-5")
    for parser in (resumed, plain):
        parser.feed(read(f"{CODEX}/exec-resume-json.jsonl"), 0.0)
    assert (resumed.finish(0, 1.0).tokens_in, plain.finish(0, 1.0).tokens_in) == (2450, 11350)
    too_high = CodexStreamParser(baseline_tokens_in=99_999)
    events = too_high.feed(read(f"{CODEX}/exec-resume-json.jsonl"), 0.0)
    assert any("baseline" in e.message for e in events if e.kind == "warning")
    assert too_high.finish(0, 1.0).tokens_in == 0


def test_codex_hook_blocked_commands_leave_no_item() -> None:
    hook_calls = [json.loads(line)["stdin"] for line in lines(f"{CODEX}/hook-stdin-payloads.jsonl")]
    pre = [h["tool_input"]["command"] for h in hook_calls if h["hook_event_name"] == "PreToolUse"]
    assert pre == ["echo hi", "rm -f hello.txt", "curl -s http://127.0.0.1:9/"]
    parser = CodexStreamParser(model="gpt-5")
    parser.feed(read(f"{CODEX}/exec-json_with-hooks-blocking.jsonl"), 0.0)
    calls = parser.finish(0, 1.0).tool_calls
    assert [c.input["command"] for c in calls] == ["/bin/bash -lc 'echo hi'"]


CODEX_FAILED = [  # verbatim from a codex 0.169.0 run, behind a thread start
    '{"type":"thread.started","thread_id":"t-1"}',
    '{"type":"turn.started"}',
    '{"type":"error","message":"Reconnecting... 1/5 (stream disconnected before completion)"}',
    '{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}',
]


def test_codex_turn_failed() -> None:
    parser = CodexStreamParser(model="gpt-5")
    events = parser.feed("\n".join(CODEX_FAILED), 0.0)
    assert [e.kind for e in events] == ["session", "warning", "result"]
    summary = parser.finish(1, 1.0)
    assert (summary.error_subtype, summary.error_message) == (
        "turn_failed",
        "stream disconnected before completion",
    )
    assert (summary.succeeded, summary.results_seen, summary.cost_usd) == (False, 1, None)


CODEX_ITEMS = [  # shapes from exec_events.rs
    {
        "id": "i1",
        "type": "mcp_tool_call",
        "server": "docs",
        "tool": "search",
        "arguments": {"q": "x"},
        "result": {"content": [{"type": "text", "text": "hit"}]},
        "error": None,
        "status": "completed",
    },
    {
        "id": "i2",
        "type": "mcp_tool_call",
        "server": "docs",
        "tool": "fetch",
        "arguments": {},
        "result": None,
        "error": {"message": "boom"},
        "status": "failed",
    },
    {
        "id": "i3",
        "type": "command_execution",
        "command": "rm -rf /",
        "aggregated_output": "",
        "exit_code": None,
        "status": "declined",
    },
    {"id": "i4", "type": "web_search", "query": "corral", "action": None},
    {
        "id": "i5",
        "type": "file_change",
        "changes": [{"path": "/w/a", "kind": "update"}],
        "status": "failed",
    },
    {
        "id": "i6",
        "type": "command_execution",
        "command": "false",
        "aggregated_output": "",
        "exit_code": 2,
        "status": "completed",
    },
    {"id": "i7", "type": "reasoning", "text": "thinking"},
]


def test_codex_other_tool_items() -> None:
    parser = CodexStreamParser()
    for i, item in enumerate(CODEX_ITEMS):
        parser.feed(json.dumps({"type": "item.completed", "item": item}), float(i))
    calls = parser.finish(0, 9.0).tool_calls
    assert [(c.tool, state(c), c.output) for c in calls] == [
        ("mcp__docs__search", "ok", "hit"),
        ("mcp__docs__fetch", "error", "boom"),
        ("exec_command", "denied", ""),
        ("web_search", "ok", None),
        ("file_change", "error", "update /w/a"),
        ("exec_command", "error", ""),
    ]
    assert calls[3].input == {"query": "corral"}


def test_opencode_uses_the_streams_own_timing_and_prices_agree() -> None:
    parser = OpenCodeStreamParser()
    feed_lines(parser, lines(f"{OC}_basic.jsonl"), step=5.0)
    assert [c.duration_ms for c in parser.finish(0, 99.0).tool_calls] == [904, 41]
    # OpenCode's own per-step cost is the gpt-5 row of the price table
    assert cost_of("gpt-5", 2150, 65, cached_in=512) == 0.0027615
    assert cost_of("openai/gpt-5", 2000, 60) == 0.0031


def test_opencode_error_event() -> None:
    parser = OpenCodeStreamParser()
    lines_ = [
        {"type": "step_start", "sessionID": "ses_1", "part": {}},
        {
            "type": "error",
            "sessionID": "ses_1",
            "error": {"name": "ProviderAuthError", "data": {"message": "no key"}},
        },
    ]
    events = parser.feed("\n".join(json.dumps(x) for x in lines_), 0.0)
    assert [e.kind for e in events] == ["session", "result"]
    summary = parser.finish(0, 1.0)
    assert (summary.error_subtype, summary.error_message, summary.succeeded) == (
        "ProviderAuthError",
        "no key",
        False,
    )


PARSERS: list[Callable[[], Any]] = [ClaudeStreamParser, CodexStreamParser, OpenCodeStreamParser]
GARBAGE = [
    b"not json",
    b'{"type": "result", "subtype"',
    b"[1, 2]",
    b'{"no_type": 1}',
    b'{"type": 5}',
    b"\xff\xfe{}",
    b'{"type": "brand_new_event", "x": 1}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("make", PARSERS)
@pytest.mark.parametrize("line", GARBAGE)
def test_garbage_becomes_one_warning(make: Callable[[], Any], line: bytes) -> None:
    parser = make()
    events = parser.feed(line, 3.0)
    assert [(e.kind, e.at) for e in events] == [("warning", 3.0)]
    assert parser.feed(b"\n  \r\n\n", 4.0) == []  # blank lines are nothing
    assert parser.finish(0, 5.0).warnings == 1


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (ClaudeStreamParser, f"{C197}_basic.jsonl"),
        (CodexStreamParser, f"{CODEX}/exec-json_minimal.jsonl"),
        (OpenCodeStreamParser, f"{OC}_basic.jsonl"),
    ],
)
def test_truncated_trailing_line_on_kill(make: Callable[[], Any], path: str) -> None:
    raw = read(path).rstrip(b"\n")
    parser = make()
    events = parser.feed(raw[: len(raw) - 40], 0.0)  # the last line cut, no newline
    assert [e.kind for e in events if e.kind == "warning"][-1:] == ["warning"]
    summary = parser.finish(0, 1.0)
    assert (summary.results_seen, summary.succeeded) == (0, False)


def reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: reverse_keys(value[k]) for k in reversed(list(value))}
    return [reverse_keys(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("case", [c for c in CASES if c.tools], ids=lambda c: c.path)
def test_key_order_does_not_matter(case: Case) -> None:
    reordered = b"".join(
        json.dumps(reverse_keys(json.loads(line))).encode() + b"\n"
        for line in lines(case.path)
        if line.strip()
    )
    parser, plain = case.make(), case.make()
    parser.feed(reordered, 0.0)
    plain.feed(read(case.path), 0.0)
    assert parser.finish(case.exit_code, 1.0) == plain.finish(case.exit_code, 1.0)


def test_unknown_types_warn_but_known_extras_do_not() -> None:
    parser = ClaudeStreamParser()
    events = parser.feed(
        '{"type":"rate_limit_event"}\n{"type":"system","subtype":"new"}\n'
        '{"type":"telemetry_v9","session_id":"s-9"}',
        0.0,
    )
    assert [(e.kind, getattr(e, "message", "")) for e in events] == [
        ("session", ""),
        ("warning", "unknown event type 'telemetry_v9'"),
    ]


def test_a_handler_failure_is_a_warning_not_a_crash() -> None:
    parser = ClaudeStreamParser()

    def boom(obj: Any, now: float, out: list[StreamEvent]) -> None:
        raise KeyError("surprise")

    parser.handlers["assistant"] = boom
    events = parser.feed(lines(f"{C197}_basic.jsonl")[1], 0.0)
    assert [e.kind for e in events] == ["session", "warning"]
    events = parser.feed('{"type":"result","modelUsage":{"m":{"inputTokens":1e400}}}', 1.0)
    assert [e.kind for e in events] == ["usage", "result"]
    assert parser.finish(0, 2.0).tokens_in == 0  # an infinite count is no count


def test_tool_output_is_truncated_on_a_character_boundary() -> None:
    parser = ClaudeStreamParser(options=StreamOptions(max_output_bytes=101))
    parser.feed(
        '{"type":"assistant","message":{"id":"m","content":[{"type":"tool_use",'
        '"id":"t1","name":"Read","input":{}}]}}',
        0.0,
    )
    content = json.dumps([{"type": "text", "text": "é" * 1000}])
    events = parser.feed(
        '{"type":"user","message":{"content":[{"type":"tool_result",'
        f'"tool_use_id":"t1","content":{content}}}]}}}}',
        0.5,
    )
    call = events[-1].call  # type: ignore[union-attr]
    assert (call.output, call.truncated, call.duration_ms) == ("é" * 50, True, 500)
    whole = ClaudeStreamParser()
    whole.feed(lines(f"{C197}_basic.jsonl")[3], 0.0)
    assert whole.finish(0, 1.0).tool_calls[0].truncated is False  # 64 KiB default


@pytest.mark.parametrize(
    ("text", "denied"),
    [
        ("PreToolUse:Bash hook error: control-plane policy: rm is not allowed", True),
        (
            "Permission to use Bash has been denied because Claude Code is running in don't ask",
            True,
        ),
        ("This command requires approval", True),
        (
            "This Bash command contains multiple operations. The following part requires approval",
            True,
        ),
        ("rm in '/w/a' was blocked. For security, Claude Code may only remove files from", True),
        ("Exit code 1", False),
        ("The user doesn't want to proceed with this tool use. The tool use was rejected", False),
        ("PostToolUse:Bash hook error: x", False),
    ],
)
def test_claude_denial_texts(text: str, denied: bool) -> None:
    assert is_denial_text(text) is denied


@pytest.mark.parametrize(
    ("model", "vendor", "expected"),
    [
        ("claude-sonnet-4-5", None, 0.01395),  # 3900 in, 150 out: Claude Code's own figure
        ("claude-sonnet-4-5-20250929", None, 0.01395),
        ("claude-unknown-9", None, 0.01395),  # the vendor default
        ("gpt-5", None, 0.006375),
        (None, "openai", 0.006375),
        ("openai/brand-new-model", None, 0.006375),  # the provider prefix names the vendor
        ("mystery-model", None, None),
    ],
)
def test_price_table(model: str | None, vendor: str | None, expected: float | None) -> None:
    assert cost_of(model, 3900, 150, vendor=vendor) == expected


def test_custom_price_table() -> None:
    table = PriceTable(models={"m": Price(in_per_mtok=2.0, out_per_mtok=4.0)})
    parser = CodexStreamParser(model="m", options=StreamOptions(prices=table))
    parser.feed(read(f"{CODEX}/exec-json_minimal.jsonl"), 0.0)
    assert parser.finish(0, 1.0).cost_usd == (2000 * 2.0 + 60 * 4.0) / 1e6
    assert table.cost_of("other", 1, 1) is None
    assert table.lookup("m-20250929") == table.lookup("provider/m") == table.models["m"]


def throughput(repeat: int = 10_000) -> None:
    """Events/s per parser on its largest fixture, a fresh parser per repetition."""
    makers: dict[str, Callable[[], StreamParser]] = {
        "claude-code": ClaudeStreamParser,
        "codex": CodexStreamParser,
        "opencode": OpenCodeStreamParser,
    }
    for name, make in makers.items():
        path = max(
            (
                p
                for p in FIXTURES.rglob("*.jsonl")
                if p.parent.name.startswith(name) and "stdin" not in p.name
            ),
            key=lambda p: p.stat().st_size,
        )
        raw = path.read_bytes().splitlines(keepends=True)
        events = 0
        start = time.perf_counter()
        for _ in range(repeat):
            parser = make()
            for line in raw:
                events += len(parser.feed(line, 0.0))
            parser.finish(0, 0.0)
        took = time.perf_counter() - start
        print(
            f"{name:9} {path.name:42} {len(raw) * repeat / took:>10,.0f} lines/s "
            f"{events / took:>10,.0f} events/s ({took:.2f} s)"
        )


if __name__ == "__main__":
    throughput()
