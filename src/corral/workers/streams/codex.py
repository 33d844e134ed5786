"""Codex CLI: `codex exec --json` (the schema of codex's `exec_events.rs`;
recorded streams: tests/fixtures/agent-cli/codex-*).

Tool calls are `item.started`/`item.completed` of the tool item types; `error` items are
warnings. Tokens come only from `turn.completed.usage`, cumulative over a resumed thread, so a
resumed run subtracts the previous run's totals (the baseline). The stream has no cost: it is
priced from the table. A command a PreToolUse hook blocks emits no item at all — count those
on the hook side. SIGINT/SIGTERM end the process with no final event.
"""

from __future__ import annotations

import re
from typing import Any

from corral.workers.streams.model import (
    JsonObj,
    LineParser,
    ResultEvent,
    StreamEvent,
    StreamOptions,
    StreamSummary,
    UsageEvent,
    exited_ok,
    get_dict,
    get_int,
    get_list,
    get_str,
    joined_text,
)

_TOOL_ITEMS = frozenset({"command_execution", "file_change", "mcp_tool_call", "web_search"})
# "unexpected status 401 Unauthorized: …", "exceeded retry limit, last status: 429 …"
_STATUS = re.compile(r"\bstatus:?\s+([1-5]\d\d)\b")
_RECONNECTING = "Reconnecting..."


def api_status(message: str | None) -> int | None:
    """The HTTP status a Codex error message names, if it names one."""
    found = _STATUS.search(message or "")
    return int(found.group(1)) if found else None


_FAILED = frozenset({"failed", "declined"})


def _tool_name(item: JsonObj) -> str:
    kind = str(item.get("type"))
    if kind == "command_execution":
        return "exec_command"  # the model-facing shell tool
    if kind == "mcp_tool_call":
        # the name its hook and the role's scope use
        return f"mcp__{get_str(item, 'server') or '?'}__{get_str(item, 'tool') or '?'}"
    return kind


def _tool_input(item: JsonObj) -> dict[str, Any]:
    kind = item.get("type")
    if kind == "command_execution":
        return {"command": item.get("command")}
    if kind == "file_change":
        return {"changes": get_list(item, "changes")}
    if kind == "mcp_tool_call":
        arguments = item.get("arguments")
        return arguments if isinstance(arguments, dict) else {"arguments": arguments}
    return {k: item[k] for k in ("query", "action") if item.get(k) is not None}


def _tool_output(item: JsonObj) -> str | None:
    kind = item.get("type")
    if kind == "command_execution":
        return get_str(item, "aggregated_output")
    if kind == "file_change":
        changes = [c for c in get_list(item, "changes") if isinstance(c, dict)]
        return "\n".join(f"{c.get('kind')} {c.get('path')}" for c in changes) or None
    if kind == "mcp_tool_call":
        error = get_dict(item, "error")
        if error:
            return get_str(error, "message")
        return joined_text(get_list(get_dict(item, "result"), "content")) or None
    return None


def _tool_failed(item: JsonObj) -> bool:
    exit_code = item.get("exit_code")
    nonzero = isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0
    return item.get("status") in _FAILED or nonzero or bool(get_dict(item, "error"))


class CodexStreamParser(LineParser):
    """Parser for one `codex exec --json` (or `codex exec resume … --json`) process.

    `model` prices the tokens (the stream never names it); `baseline_*` are the thread's
    cumulative totals after the previous run, for a resumed thread.
    """

    ignored = frozenset({"turn.started", "item.plan.delta", "request_user_input"})

    def __init__(
        self,
        *,
        model: str | None = None,
        baseline_tokens_in: int = 0,
        baseline_tokens_out: int = 0,
        baseline_cached_in: int = 0,
        options: StreamOptions | None = None,
    ) -> None:
        super().__init__(options)
        self.handlers = {
            "thread.started": self._thread_started,
            "turn.completed": self._turn_completed,
            "turn.failed": self._turn_failed,
            "item.started": self._item,
            "item.updated": self._item,
            "item.completed": self._item,
            "error": self._error,
        }
        self.model = model or self.options.model
        self._baseline = (baseline_tokens_in, baseline_tokens_out, baseline_cached_in)
        self._tokens: tuple[int, int, int] | None = None  # this run's (in, out, cached)
        self._final_text: str | None = None
        self._results_seen = 0
        self._failure: str | None = None  # the last terminal event was turn.failed: its message
        self._retrying: str | None = None  # the last word was "Reconnecting…": its message

    def _thread_started(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        self.see_session(obj.get("thread_id"), now, out)

    def _item(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        item = get_dict(obj, "item")
        kind = item.get("type")
        completed = obj["type"] == "item.completed"
        if kind != "error":
            self._retrying = None  # the model answered
        if kind in _TOOL_ITEMS:
            self._tool_item(item, completed, now, out)
        elif kind == "agent_message" and completed:
            self._final_text = get_str(item, "text")
        elif kind == "error":  # warnings such as missing model metadata
            self.warn(out, now, f"codex: {get_str(item, 'message')}")

    def _tool_item(
        self, item: JsonObj, completed: bool, now: float, out: list[StreamEvent]
    ) -> None:
        call_id = get_str(item, "id")
        if not call_id:
            return
        started = self.calls.start(
            call_id, _tool_name(item), _tool_input(item), parent_id=None, at=now
        )
        if started is not None:
            out.append(started)
        if not completed:
            return
        finished = self.calls.finish(
            call_id,
            at=now,
            output=_tool_output(item),
            is_error=_tool_failed(item),
            denied=item.get("status") == "declined",
        )
        if finished is not None:
            out.append(finished)

    def _turn_completed(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        usage = get_dict(obj, "usage")
        cumulative = (
            get_int(usage, "input_tokens"),
            get_int(usage, "output_tokens"),
            get_int(usage, "cached_input_tokens"),
        )
        delta = tuple(c - b for c, b in zip(cumulative, self._baseline, strict=True))
        if min(delta) < 0:
            self.warn(out, now, f"usage {cumulative} below the resume baseline {self._baseline}")
        self._tokens = (max(delta[0], 0), max(delta[1], 0), max(delta[2], 0))
        out.append(
            UsageEvent(
                at=now,
                tokens_in=self._tokens[0],
                tokens_out=self._tokens[1],
                cost_usd=self._cost(),
                final=True,
            )
        )
        self._terminal(None, now, out)

    def _turn_failed(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        message = get_str(get_dict(obj, "error"), "message") or "turn failed"
        self._terminal(message, now, out)

    def _terminal(self, failure: str | None, now: float, out: list[StreamEvent]) -> None:
        self._results_seen += 1
        self._retrying = None
        self._failure = failure
        subtype = "turn_completed" if failure is None else "turn_failed"
        out.append(
            ResultEvent(
                at=now,
                subtype=subtype,
                is_error=failure is not None,
                text=self._final_text if failure is None else failure,
            )
        )

    def _error(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        message = get_str(obj, "message")
        if (message or "").startswith(_RECONNECTING):  # a failed model call, retried
            self._retrying = message
        self.warn(out, now, f"codex error: {message}")

    def _cost(self) -> float | None:
        if self._tokens is None:
            return None
        tokens_in, tokens_out, cached = self._tokens
        return self.options.prices.cost_of(
            self.model, tokens_in, tokens_out, cached_in=cached, vendor="openai"
        )

    def finish(self, exit_code: int | None, now: float) -> StreamSummary:
        """The run's summary: success is exit 0 after a last `turn.completed`."""
        tokens_in, tokens_out, cached = self._tokens or (0, 0, 0)
        cost = self._cost()
        completed = self._results_seen > 0 and self._failure is None
        return StreamSummary(
            session_id=self.session_id,
            model=self.model,
            cli_version=None,
            tool_calls=self.calls.frozen(),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            tokens_cached_in=cached,
            cost_usd=cost,
            cost_source=None if cost is None else "price_table",
            final_text=self._final_text,
            error_subtype=None if self._failure is None else "turn_failed",
            error_message=self._failure or self._retrying,
            terminal_reason=None,
            results_seen=self._results_seen,
            denied_calls=self.calls.denied_count(),
            warnings=self.warnings,
            succeeded=exited_ok(exit_code) and completed,
            # a turn fails when its model calls do (the agent itself cannot fail a turn)
            api_failed=self._failure is not None,
            api_retrying=self._retrying is not None,
            api_error_status=api_status(self._failure or self._retrying),
        )
