"""Claude Code: `claude -p --output-format stream-json --verbose`
(recorded streams: tests/fixtures/agent-cli/claude-code-*).

Tool calls are `tool_use` blocks in `assistant` lines (one content block per line, lines of
one API message share `message.id`), ended by `tool_result` blocks in `user` lines. Totals
come from `result` lines: `modelUsage` (cumulative for the process, includes sub-agents; its
`usage` is per turn and all zeros on `error_max_budget_usd`) and `total_cost_usd` (cumulative;
2.1.330 may print two results, the last one counts). Before a result, tokens are counted live
per message: input from `message_start` (or the assistant line's snapshot), output from the
last `message_delta` (with `--include-partial-messages`).
"""

from __future__ import annotations

import re
from typing import Any

from corral.workers.streams.model import (
    CostSource,
    JsonObj,
    LineParser,
    ResultEvent,
    StreamEvent,
    StreamOptions,
    StreamSummary,
    UsageEvent,
    exited_ok,
    get_dict,
    get_float,
    get_int,
    get_list,
    get_str,
    joined_text,
)

# The texts a refused call's tool_result carries. 2.1.197 puts a hook's deny
# reason there bare, so those denials are known only from `result.permission_denials`.
_HOOK_DENIAL = re.compile(r"PreToolUse:\S* hook error: ")
_DENIAL_PREFIXES = (
    "Permission to use ",  # deny rule, or dontAsk mode
    "This command requires approval",  # an "ask" turns into a denial in -p mode
    "This Bash command contains multiple operations",  # a compound part needs approval
)
_DENIAL_FRAGMENTS = (" was blocked. For security, Claude Code may only ",)
_COMPLETED = (None, "completed")  # terminal reasons of a run that ended on its own


def is_denial_text(text: str) -> bool:
    """Whether an error tool_result's text says a permission rule or a hook refused the call."""
    return (
        _HOOK_DENIAL.match(text) is not None
        or text.startswith(_DENIAL_PREFIXES)
        or any(fragment in text for fragment in _DENIAL_FRAGMENTS)
    )


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return joined_text(content)
    return None


def _rejected(meta: JsonObj | None) -> bool:
    """2.1.330's `tool_result_meta` says a rule or hook rejected the call."""
    return meta is not None and get_dict(meta, "permission_decision").get("decision") == "reject"


def _usage_figures(usage: JsonObj) -> tuple[int, int, int]:
    """(input incl. cache, output, cache reads) of a Messages-API `usage` object."""
    cached = get_int(usage, "cache_read_input_tokens")
    tokens_in = get_int(usage, "input_tokens") + get_int(usage, "cache_creation_input_tokens")
    return tokens_in + cached, get_int(usage, "output_tokens"), cached


def _result_figures(result: JsonObj) -> tuple[int, int, int] | None:
    """Token totals of a `result`: `modelUsage` summed over models, else `usage`."""
    models = [v for v in get_dict(result, "modelUsage").values() if isinstance(v, dict)]
    if models:
        cached = sum(get_int(m, "cacheReadInputTokens") for m in models)
        tokens_in = sum(
            get_int(m, "inputTokens") + get_int(m, "cacheCreationInputTokens") for m in models
        )
        return tokens_in + cached, sum(get_int(m, "outputTokens") for m in models), cached
    usage = result.get("usage")
    return _usage_figures(usage) if isinstance(usage, dict) else None


class _LiveTokens:
    """Token totals: the last result's, plus every API message seen since, counted once each."""

    def __init__(self) -> None:
        self.tokens_in = self.tokens_out = self.cached = 0
        self.open_message: dict[str | None, str] = {}  # sub-agent parent id → streaming msg id
        self._messages: dict[str, tuple[int, int, int]] = {}
        self._settled: set[str] = set()

    def observe(self, message_id: str, usage: JsonObj) -> bool:
        """Merge one usage snapshot of a message (figures only grow); whether totals changed."""
        if message_id in self._settled:
            return False
        old = self._messages.get(message_id, (0, 0, 0))
        new = tuple(max(a, b) for a, b in zip(old, _usage_figures(usage), strict=True))
        if new == old:
            return False
        self._messages[message_id] = (new[0], new[1], new[2])
        self.tokens_in += new[0] - old[0]
        self.tokens_out += new[1] - old[1]
        self.cached += new[2] - old[2]
        return True

    def settle(self, figures: tuple[int, int, int]) -> None:
        """A result's totals replace the live count; messages counted so far are in them."""
        self._settled.update(self._messages)
        self._messages.clear()
        self.tokens_in, self.tokens_out, self.cached = figures


class ClaudeStreamParser(LineParser):
    """Parser for one `claude -p --output-format stream-json --verbose` process."""

    ignored = frozenset(
        {
            "control_request",
            "control_response",
            "control_cancel_request",
            "rate_limit_event",
            "prompt_suggestion",
            "keep_alive",
        }
    )
    session_key = "session_id"

    def __init__(self, *, options: StreamOptions | None = None) -> None:
        super().__init__(options)
        self.handlers = {
            "system": self._system,
            "assistant": self._assistant,
            "user": self._user,
            "result": self._result,
            "stream_event": self._stream_event,
        }
        self.model: str | None = None
        self.cli_version: str | None = None
        self._tokens = _LiveTokens()
        self._last_text: str | None = None
        self._results_seen = 0
        self._last_result: JsonObj | None = None
        self._cost: float | None = None
        self._retry_status: int | None = None  # HTTP status of the last failed API call retried
        self._retrying = False  # an `api_retry` is the last word about the model API

    def _system(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        subtype = obj.get("subtype")
        if subtype == "init":  # the base class took its session_id
            self.model = get_str(obj, "model") or self.model
            self.cli_version = get_str(obj, "claude_code_version") or self.cli_version
        elif subtype == "permission_denied":  # 2.1.330, before the tool_result
            call_id = get_str(obj, "tool_use_id")
            if call_id:
                self.calls.deny(call_id)
        elif subtype == "api_retry":  # a failed model call, retried (`error_status`, `error`)
            status = obj.get("error_status")
            self._retry_status = status if isinstance(status, int) else None
            self._retrying = True
        elif subtype == "task_notification":  # a sub-agent's own timing for its Agent call
            call_id = get_str(obj, "tool_use_id")
            duration = get_dict(obj, "usage").get("duration_ms")
            if call_id and isinstance(duration, int):
                self.calls.set_duration(call_id, duration)

    def _assistant(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        message = get_dict(obj, "message")
        if get_str(message, "model") != "<synthetic>":  # the CLI's own words are no answer
            self._retrying = False
        parent = get_str(obj, "parent_tool_use_id")
        if self.model is None and parent is None:
            self.model = get_str(message, "model")
        message_id = get_str(message, "id")
        if message_id:
            self._count(message_id, get_dict(message, "usage"), now, out)
        for block in get_list(message, "content"):
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            call_id = get_str(block, "id")
            if kind == "tool_use" and call_id:
                event = self.calls.start(
                    call_id,
                    get_str(block, "name") or "",
                    get_dict(block, "input"),
                    parent_id=parent,
                    at=now,
                )
                if event is not None:
                    out.append(event)
            elif kind == "text" and parent is None:
                self._last_text = get_str(block, "text")

    def _user(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        metas = {
            m["id"]: m
            for m in get_list(obj, "tool_result_meta")
            if isinstance(m, dict) and isinstance(m.get("id"), str)
        }
        for block in get_list(get_dict(obj, "message"), "content"):
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = get_str(block, "tool_use_id")
            if not call_id:
                continue
            text = _content_text(block.get("content"))
            is_error = block.get("is_error") is True
            denied = is_error and (_rejected(metas.get(call_id)) or is_denial_text(text or ""))
            event = self.calls.finish(
                call_id, at=now, output=text, is_error=is_error, denied=denied
            )
            if event is not None:
                out.append(event)

    def _result(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        self._results_seen += 1
        self._retrying = False
        self._last_result = obj
        cost = get_float(obj, "total_cost_usd")
        if cost is not None:  # cumulative for the process: the last one holds the total
            self._cost = cost
        for denial in get_list(obj, "permission_denials"):
            if isinstance(denial, dict) and isinstance(denial.get("tool_use_id"), str):
                self.calls.deny(denial["tool_use_id"])
        figures = _result_figures(obj)
        if figures is not None:
            self._tokens.settle(figures)
        t = self._tokens
        out.append(
            UsageEvent(
                at=now,
                tokens_in=t.tokens_in,
                tokens_out=t.tokens_out,
                cost_usd=self._cost,
                final=True,
            )
        )
        out.append(
            ResultEvent(
                at=now,
                subtype=get_str(obj, "subtype"),
                is_error=obj.get("is_error") is True,
                text=get_str(obj, "result"),
                terminal_reason=get_str(obj, "terminal_reason"),
            )
        )

    def _stream_event(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        event = get_dict(obj, "event")
        self._retrying = False  # the model is answering
        parent = get_str(obj, "parent_tool_use_id")
        kind = event.get("type")
        if kind == "message_start":
            message = get_dict(event, "message")
            message_id = get_str(message, "id")
            if message_id:
                self._tokens.open_message[parent] = message_id
                self._count(message_id, get_dict(message, "usage"), now, out)
        elif kind == "message_delta":
            message_id = self._tokens.open_message.get(parent)
            if message_id:
                self._count(message_id, get_dict(event, "usage"), now, out)

    def _count(self, message_id: str, usage: JsonObj, now: float, out: list[StreamEvent]) -> None:
        if usage and self._tokens.observe(message_id, usage):
            # The running cost, from the price table (the CLI reports its own only at the end):
            # what a budget ceiling is held to while the agent runs.
            out.append(
                UsageEvent(
                    at=now,
                    tokens_in=self._tokens.tokens_in,
                    tokens_out=self._tokens.tokens_out,
                    cost_usd=self._cost_and_source()[0],
                )
            )

    def _cost_and_source(self) -> tuple[float | None, CostSource | None]:
        if self._cost is not None:
            return self._cost, "cli"
        t = self._tokens
        if not (t.tokens_in or t.tokens_out):
            return None, None
        # No result (SIGTERM): an estimate from the live count, which under-counts output
        # unless the run had --include-partial-messages.
        cost = self.options.prices.cost_of(
            self.model or self.options.model,
            t.tokens_in,
            t.tokens_out,
            cached_in=t.cached,
            vendor="anthropic",
        )
        return cost, None if cost is None else "price_table"

    def finish(self, exit_code: int | None, now: float) -> StreamSummary:
        """The run's summary. Success needs exit 0 *and* a last result that says so."""
        last = self._last_result or {}
        subtype, is_error = get_str(last, "subtype"), last.get("is_error") is True
        terminal_reason = get_str(last, "terminal_reason")
        error_subtype = subtype if subtype not in (None, "success") else None
        if error_subtype is None and is_error:
            error_subtype = "is_error"
        errors = [e for e in get_list(last, "errors") if isinstance(e, str)]
        result_text = get_str(last, "result")
        status = last.get("api_error_status")
        api_failed = terminal_reason == "api_error" or isinstance(status, int)
        if not isinstance(status, int):
            status = self._retry_status if api_failed or self._retrying else None
        # An API error's result carries its message as the result text ("Not logged in · …")
        message = "; ".join(errors) or (result_text if is_error else None)
        cost, source = self._cost_and_source()
        t = self._tokens
        return StreamSummary(
            session_id=self.session_id,
            model=self.model,
            cli_version=self.cli_version,
            tool_calls=self.calls.frozen(),
            tokens_in=t.tokens_in,
            tokens_out=t.tokens_out,
            tokens_cached_in=t.cached,
            cost_usd=cost,
            cost_source=source,
            final_text=result_text if result_text is not None else self._last_text,
            error_subtype=error_subtype,
            error_message=message or None,
            terminal_reason=terminal_reason,
            results_seen=self._results_seen,
            denied_calls=self.calls.denied_count(),
            warnings=self.warnings,
            succeeded=(
                exited_ok(exit_code)
                and self._results_seen > 0
                and subtype == "success"
                and not is_error
                and terminal_reason in _COMPLETED
            ),
            api_failed=api_failed,
            api_retrying=self._retrying,
            api_error_status=status,
        )
