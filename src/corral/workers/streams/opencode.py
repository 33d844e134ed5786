"""OpenCode: `opencode run --format json` (recorded streams: tests/fixtures/agent-cli/opencode-*).

Every line is `{type, timestamp, sessionID, part}`. A `tool_use` line arrives once, when the
call reached its final state (`part.state.status` completed/error, with the stream's own
`state.time`). Tokens and cost come per `step_finish` and are summed over steps. There is no
final result event: a run that ended well has a last `step_finish` with reason "stop" and
exit 0. A refused call is an `error` state whose text names the permission rule.
"""

from __future__ import annotations

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
    get_str,
)

DENIAL_TEXTS = (
    # a `deny` rule matched
    "The user has specified a rule which prevents you from using this specific tool call",
    # an `ask` rule, auto-rejected because `run` has nobody to ask
    "The user rejected permission to use this specific tool call",
)
_FINAL_STATES = frozenset({"completed", "error"})


def _duration_ms(state: JsonObj) -> int | None:
    time = get_dict(state, "time")
    start, end = time.get("start"), time.get("end")
    if isinstance(start, int) and isinstance(end, int) and end >= start:
        return end - start
    return None


# Errors of the model provider, and the HTTP status a named one stands for (an APIError carries
# its own `statusCode`); other errors (context overflow, aborted) are the run's own.
_API_ERRORS = {"APIError": None, "ProviderAuthError": 401, "ProviderModelNotFoundError": 404}


def _api_status(error: Any) -> int | None:
    """The HTTP status of a provider error event's `error` (None when it names none)."""
    if not isinstance(error, dict):
        return None
    status = get_dict(error, "data").get("statusCode")
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    return _API_ERRORS.get(get_str(error, "name") or "")


def _error_text(error: Any) -> tuple[str, str | None]:
    """(name, message) of an `error` event's `error` field, whatever shape it has."""
    if isinstance(error, str):
        return "error", error
    if not isinstance(error, dict):
        return "error", None
    message = get_str(get_dict(error, "data"), "message") or get_str(error, "message")
    return get_str(error, "name") or "error", message


class OpenCodeStreamParser(LineParser):
    """Parser for one `opencode run --format json` process."""

    session_key = "sessionID"

    def __init__(self, *, options: StreamOptions | None = None) -> None:
        super().__init__(options)
        self.handlers = {
            "tool_use": self._tool_use,
            "step_finish": self._step_finish,
            "text": self._text,
            "error": self._error_event,
            "step_start": self._nothing,
            "reasoning": self._nothing,
        }
        self._tokens_in = self._tokens_out = self._cached = 0
        self._cost: float | None = None
        self._final_text: str | None = None
        self._results_seen = 0
        self._last_reason: str | None = None  # of the last step_finish, or the error's name
        self._failure: tuple[str, str | None] | None = None  # set while an error is the last word
        self._api_status: int | None = None  # of the last provider error

    def _nothing(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        """Known lines with nothing to take but the session id (the base reads that)."""

    def _tool_use(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        part = get_dict(obj, "part")
        state = get_dict(part, "state")
        call_id = get_str(part, "callID") or get_str(part, "id")
        if not call_id:
            return
        # Only the final state is printed; a start is reported with it so every CLI's
        # calls are counted the same way.
        started = self.calls.start(
            call_id, get_str(part, "tool") or "", get_dict(state, "input"), parent_id=None, at=now
        )
        if started is not None:
            out.append(started)
        status = get_str(state, "status")
        if status not in _FINAL_STATES:
            return
        is_error = status == "error"
        text = get_str(state, "error") if is_error else get_str(state, "output")
        denied = is_error and (text or "").startswith(DENIAL_TEXTS)
        finished = self.calls.finish(
            call_id,
            at=now,
            output=text,
            is_error=is_error,
            denied=denied,
            duration_ms=_duration_ms(state),
        )
        if finished is not None:
            out.append(finished)

    def _step_finish(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        part = get_dict(obj, "part")
        tokens = get_dict(part, "tokens")
        cache = get_dict(tokens, "cache")
        # OpenCode splits what the API reports: `input` excludes cache reads and writes,
        # `output` excludes reasoning. Put them back so figures match the other CLIs'.
        cached = get_int(cache, "read")
        self._tokens_in += get_int(tokens, "input") + cached + get_int(cache, "write")
        self._tokens_out += get_int(tokens, "output") + get_int(tokens, "reasoning")
        self._cached += cached
        cost = get_float(part, "cost")
        if cost is not None:
            self._cost = (self._cost or 0.0) + cost
        self._last_reason = get_str(part, "reason")
        self._failure = None
        out.append(
            UsageEvent(
                at=now, tokens_in=self._tokens_in, tokens_out=self._tokens_out, cost_usd=self._cost
            )
        )
        if self._last_reason == "stop":
            self._results_seen += 1
            out.append(
                ResultEvent(
                    at=now,
                    subtype="stop",
                    is_error=False,
                    text=self._final_text,
                    terminal_reason="stop",
                )
            )

    def _text(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        text = get_str(get_dict(obj, "part"), "text")
        if text is not None:
            self._final_text = text

    def _error_event(self, obj: JsonObj, now: float, out: list[StreamEvent]) -> None:
        self._failure = _error_text(obj.get("error"))
        self._api_status = _api_status(obj.get("error"))
        self._last_reason = self._failure[0]
        self._results_seen += 1
        out.append(
            ResultEvent(
                at=now,
                subtype=self._failure[0],
                is_error=True,
                text=self._failure[1],
                terminal_reason=self._failure[0],
            )
        )

    def _cost_and_source(self) -> tuple[float | None, CostSource | None]:
        if self._cost is not None:
            return self._cost, "cli"
        if not (self._tokens_in or self._tokens_out):
            return None, None
        cost = self.options.prices.cost_of(
            self.options.model, self._tokens_in, self._tokens_out, cached_in=self._cached
        )
        return cost, None if cost is None else "price_table"

    def finish(self, exit_code: int | None, now: float) -> StreamSummary:
        """The run's summary: success is exit 0 after a last `step_finish` "stop"."""
        cost, source = self._cost_and_source()
        name, message = self._failure or (None, None)
        return StreamSummary(
            session_id=self.session_id,
            model=self.options.model,
            cli_version=None,
            tool_calls=self.calls.frozen(),
            tokens_in=self._tokens_in,
            tokens_out=self._tokens_out,
            tokens_cached_in=self._cached,
            cost_usd=cost,
            cost_source=source,
            final_text=self._final_text,
            error_subtype=name,
            error_message=message,
            terminal_reason=self._last_reason,
            results_seen=self._results_seen,
            denied_calls=self.calls.denied_count(),
            warnings=self.warnings,
            succeeded=exited_ok(exit_code) and self._last_reason == "stop",
            api_failed=name in _API_ERRORS,
            api_error_status=self._api_status if self._failure else None,
        )
