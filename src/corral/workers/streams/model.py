"""Normalised values of the agent CLIs' machine-readable streams, and the shared line core.

Each parser (claude.py, codex.py, opencode.py) takes one NDJSON line at a time and returns
`StreamEvent`s for live governance; at process exit `finish` returns one `StreamSummary`.
The stream facts they rely on are the recorded runs in tests/fixtures/agent-cli/ (one folder
per CLI version), which tests/unit/test_streams.py replays. A parser never raises on what a
CLI prints: lines it cannot use become `warning` events.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeAlias

from corral.workers.streams.prices import DEFAULT_PRICES, PriceTable

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
EXCERPT_CHARS = 200

JsonObj: TypeAlias = dict[str, Any]
CostSource: TypeAlias = Literal["cli", "price_table"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOptions:
    """Settings every parser shares. `model` prices tokens when the stream names no model."""

    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    prices: PriceTable = DEFAULT_PRICES
    model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One tool call as the stream reported it. `finished` False: no end seen (killed run)."""

    id: str
    tool: str
    input: Mapping[str, Any] = field(default_factory=dict)
    output: str | None = None
    truncated: bool = False
    is_error: bool = False
    denied: bool = False
    duration_ms: int | None = None
    parent_id: str | None = None
    finished: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEvent:
    """The run's session id is known (Claude session, Codex thread, OpenCode session)."""

    kind: Literal["session"] = "session"
    at: float
    session_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStarted:
    """A tool call began (OpenCode reports it together with its end)."""

    kind: Literal["tool_started"] = "tool_started"
    at: float
    call: ToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFinished:
    """A tool call ended; `call` holds its output, error and denial as known at this point."""

    kind: Literal["tool_finished"] = "tool_finished"
    at: float
    call: ToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageEvent:
    """Running token totals for the process; `final` when they come from a terminal event."""

    kind: Literal["usage"] = "usage"
    at: float
    tokens_in: int
    tokens_out: int
    cost_usd: float | None = None
    final: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultEvent:
    """A terminal (or, for Claude with sub-agents, intermediate) verdict from the stream."""

    kind: Literal["result"] = "result"
    at: float
    subtype: str | None
    is_error: bool
    text: str | None = None
    terminal_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WarningEvent:
    """A line the parser could not use; `line` is its first characters."""

    kind: Literal["warning"] = "warning"
    at: float
    message: str
    line: str = ""


StreamEvent: TypeAlias = (
    SessionEvent | ToolStarted | ToolFinished | UsageEvent | ResultEvent | WarningEvent
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSummary:
    """What one run did, at process exit. `tokens_in` includes the `tokens_cached_in` share."""

    session_id: str | None
    model: str | None
    cli_version: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached_in: int = 0
    cost_usd: float | None = None
    cost_source: CostSource | None = None
    final_text: str | None = None
    error_subtype: str | None = None
    error_message: str | None = None
    terminal_reason: str | None = None
    results_seen: int = 0
    denied_calls: int = 0
    warnings: int = 0
    succeeded: bool = False
    # The model API's side (workers/faults.py): the run ended on a failed call to it, the CLI
    # was still retrying one when it ended, and the HTTP status of the last such failure.
    api_failed: bool = False
    api_retrying: bool = False
    api_error_status: int | None = None


class StreamParser(Protocol):
    """The interface every CLI parser has; one parser per worker process."""

    def feed(self, line: bytes | str, now: float) -> list[StreamEvent]: ...

    def finish(self, exit_code: int | None, now: float) -> StreamSummary: ...


def truncate(text: str, max_bytes: int) -> tuple[str, bool]:
    """`text` cut to at most `max_bytes` of UTF-8 (never mid-character), and whether it was cut."""
    if len(text) * 4 <= max_bytes:  # cannot exceed: skip the encode
        return text, False
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text, False
    return raw[: max(max_bytes, 0)].decode("utf-8", "ignore"), True


def get_dict(obj: Mapping[str, Any], key: str) -> JsonObj:
    """The field if it is an object, else an empty one: CLI field shapes drift."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def get_list(obj: Mapping[str, Any], key: str) -> list[Any]:
    """The field if it is a list, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, list) else []


def get_str(obj: Mapping[str, Any], key: str) -> str | None:
    """The field if it is a string, else None."""
    value = obj.get(key)
    return value if isinstance(value, str) else None


def get_float(obj: Mapping[str, Any], key: str) -> float | None:
    """A finite number field; None when absent, not a number, NaN or ±inf (JSON `1e400`)."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range
        return None
    return number if math.isfinite(number) else None


def get_int(obj: Mapping[str, Any], key: str) -> int:
    """An integer field, 0 when absent or not a finite number (bools are not numbers here)."""
    value = obj.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = get_float(obj, key)
    return 0 if number is None else int(number)


def joined_text(blocks: list[Any]) -> str:
    """The `text` of every `{"type": "text", "text": …}`-like block, one per line."""
    return "\n".join(
        block["text"]
        for block in blocks
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )


class _Call:
    """A tool call being tracked; frozen into a `ToolCall` for events and the summary."""

    __slots__ = (
        "denied",
        "duration_ms",
        "ended_at",
        "finished",
        "id",
        "input",
        "is_error",
        "output",
        "parent_id",
        "started_at",
        "tool",
        "truncated",
    )

    def __init__(
        self,
        call_id: str,
        tool: str,
        tool_input: Mapping[str, Any],
        parent_id: str | None,
        started_at: float | None,
    ) -> None:
        self.id, self.tool, self.input, self.parent_id = call_id, tool, tool_input, parent_id
        self.started_at = started_at
        self.output: str | None = None
        self.truncated = self.is_error = self.denied = self.finished = False
        self.duration_ms: int | None = None  # the stream's own timing, when it gives one
        self.ended_at: float | None = None

    def frozen(self) -> ToolCall:
        duration = self.duration_ms
        if duration is None and self.started_at is not None and self.ended_at is not None:
            duration = round((self.ended_at - self.started_at) * 1000)
        return ToolCall(
            id=self.id,
            tool=self.tool,
            input=self.input,
            output=self.output,
            truncated=self.truncated,
            is_error=self.is_error,
            denied=self.denied,
            duration_ms=duration,
            parent_id=self.parent_id,
            finished=self.finished,
        )


class CallBook:
    """The tool calls of one run in first-seen order; repeated lines never count twice."""

    def __init__(self, max_output_bytes: int) -> None:
        self._calls: dict[str, _Call] = {}
        self._denied: set[str] = set()  # ids refused, whether or not the call itself was seen
        self._max = max_output_bytes

    def start(
        self,
        call_id: str,
        tool: str,
        tool_input: Mapping[str, Any],
        *,
        parent_id: str | None,
        at: float,
    ) -> ToolStarted | None:
        """Record a call's start; None when the id is already known."""
        if call_id in self._calls:
            return None
        call = self._calls[call_id] = _Call(call_id, tool, tool_input, parent_id, at)
        call.denied = call_id in self._denied
        return ToolStarted(at=at, call=call.frozen())

    def finish(
        self,
        call_id: str,
        *,
        at: float,
        output: str | None,
        is_error: bool,
        denied: bool = False,
        duration_ms: int | None = None,
    ) -> ToolFinished | None:
        """Record a call's end (a call never seen starting is created); None if already ended."""
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = _Call(call_id, "", {}, None, None)
        if call.finished:
            return None
        if output is not None:
            call.output, call.truncated = truncate(output, self._max)
        call.is_error, call.finished, call.ended_at = is_error, True, at
        if duration_ms is not None:
            call.duration_ms = duration_ms
        if denied:
            self.deny(call_id)
        call.denied = call.denied or call_id in self._denied
        return ToolFinished(at=at, call=call.frozen())

    def deny(self, call_id: str) -> None:
        """Mark a call refused, also when the stream names it only in a final list."""
        self._denied.add(call_id)
        call = self._calls.get(call_id)
        if call is not None:
            call.denied = True

    def set_duration(self, call_id: str, duration_ms: int) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.duration_ms = duration_ms

    def frozen(self) -> tuple[ToolCall, ...]:
        return tuple(call.frozen() for call in self._calls.values())

    def denied_count(self) -> int:
        return len(self._denied)


Handler: TypeAlias = Callable[[JsonObj, float, list[StreamEvent]], None]


_decode_json = json.JSONDecoder().decode


def split_lines(data: bytes | str) -> list[str]:
    """The non-blank lines in `data`; text after the last newline is a line too (kill, EOF).

    Bytes that are not UTF-8 become U+FFFD: the event survives with a damaged string.
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return [part for part in (p.strip() for p in text.split("\n")) if part]


class LineParser:
    """Shared core: split, decode JSON (never by prefix), dispatch on `type`, warn on surprises.

    `feed` takes whole lines as a reader's `readline` yields them; one call may hold several.
    Subclasses fill `handlers`, name the types they know but ignore in `ignored`, and the
    per-line session field in `session_key`.
    """

    ignored: ClassVar[frozenset[str]] = frozenset()
    session_key: ClassVar[str | None] = None  # a field on every line that names the session

    def __init__(self, options: StreamOptions | None) -> None:
        self.options = options or StreamOptions()
        self.calls = CallBook(self.options.max_output_bytes)
        self.session_id: str | None = None
        self.warnings = 0
        self.handlers: dict[str, Handler] = {}

    def feed(self, line: bytes | str, now: float) -> list[StreamEvent]:
        """Parse one line (or several); the events it produced, in order. Never raises."""
        out: list[StreamEvent] = []
        for raw in split_lines(line):
            self._feed_one(raw, now, out)
        return out

    def _feed_one(self, raw: str, now: float, out: list[StreamEvent]) -> None:
        try:
            obj = _decode_json(raw)
        except (ValueError, RecursionError):  # not JSON, or a line cut short by a kill
            self.warn(out, now, "unparseable line", raw)
            return
        kind = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(kind, str):
            self.warn(out, now, "not an event object with a string 'type'", raw)
            return
        if self.session_key is not None:
            self.see_session(obj.get(self.session_key), now, out)
        handler = self.handlers.get(kind)
        if handler is None:
            if kind not in self.ignored:
                self.warn(out, now, f"unknown event type {kind!r}", raw)
            return
        try:
            handler(obj, now, out)
        except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
            # Field shapes drift between CLI versions; a supervisor must keep reading.
            self.warn(out, now, f"malformed {kind!r} event ({type(exc).__name__}: {exc})", raw)

    def warn(self, out: list[StreamEvent], now: float, message: str, raw: str = "") -> None:
        self.warnings += 1
        out.append(WarningEvent(at=now, message=message, line=raw[:EXCERPT_CHARS]))

    def see_session(self, session_id: object, now: float, out: list[StreamEvent]) -> None:
        """Adopt the first session id seen; every line of one process names the same one."""
        if self.session_id is None and isinstance(session_id, str) and session_id:
            self.session_id = session_id
            out.append(SessionEvent(at=now, session_id=session_id))


def exited_ok(exit_code: int | None) -> bool:
    """Exit status 0. None (status unknown) and signal deaths never count as success."""
    return exit_code == 0
