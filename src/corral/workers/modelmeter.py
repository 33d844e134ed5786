"""Metering one model call from its response bytes, as they arrive.

Two wire formats (the ones the agent CLIs speak):

* Anthropic Messages (`POST …/v1/messages`, Claude Code; OpenCode's anthropic provider):
  `message_start` carries the input tokens (`input_tokens` + `cache_creation_input_tokens` +
  `cache_read_input_tokens`); `message_delta.usage.output_tokens` the output so far.
* OpenAI Responses (`POST …/v1/responses`, Codex and OpenCode's openai provider): the usage
  comes only with `response.completed` (or `.incomplete` / `.failed`).

Between those figures the output is *estimated*: every output delta (text, tool-call arguments,
reasoning) counts its characters, and until the provider's own count arrives the output is
`ceil(chars / 4)` tokens — or the provider's count so far, if higher. The input of a Responses
call is estimated the same way from the request body until `response.completed`. The provider's
figures replace the estimates as soon as they arrive. A plain JSON answer (`stream: false`) is
read whole at its end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ANTHROPIC = "anthropic"
OPENAI = "openai"
CHARS_PER_TOKEN = 4

_OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.output_audio_transcript.delta",
    }
)
_RESPONSES_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
MAX_EVENT = 16 << 20  # an SSE event longer than this is not parsed (it still passes through)


def api_of(path: str) -> str | None:
    """The wire format of a model call by its path, or None for anything else."""
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/messages"):
        return ANTHROPIC
    if path.endswith("/responses"):
        return OPENAI
    return None


def _est(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


@dataclass(slots=True)
class CallMeter:
    """The tokens of one model call so far; `feed` it the response body as it comes."""

    api: str
    model: str | None = None
    request_chars: int = 0
    sse: bool = True
    tokens_in: int | None = None  # the provider's figure, once known
    cached_in: int = 0
    reported_out: int = 0  # the provider's output figure so far
    out_chars: int = 0
    final: bool = False
    _buf: bytes = b""

    @property
    def input_tokens(self) -> int:
        if self.tokens_in is not None:
            return self.tokens_in
        return _est(self.request_chars) if self.api == OPENAI else 0

    @property
    def output_tokens(self) -> int:
        if self.final:
            return self.reported_out
        return max(self.reported_out, _est(self.out_chars))

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        if not self.sse:
            return  # read whole at the end
        if b"\r" in self._buf:  # CRLF (or CR) line ends: read as LF
            self._buf = (
                self._buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                if not self._buf.endswith(b"\r")
                else self._buf[:-1].replace(b"\r\n", b"\n").replace(b"\r", b"\n") + b"\r"
            )
        *events, self._buf = self._buf.split(b"\n\n")
        for event in events:
            self._event(event)
        if len(self._buf) > MAX_EVENT:
            self._buf = b""

    def end(self) -> None:
        """The body is complete: read a plain JSON answer, or an unterminated last event."""
        if not self.sse:
            try:
                body = json.loads(self._buf)
            except ValueError:
                body = None
            if isinstance(body, dict):
                self._usage(body.get("usage"))
                if self.api == OPENAI and body.get("usage") is not None:
                    self.final = True
                if self.api == ANTHROPIC and body.get("usage") is not None:
                    self.final = True
        elif self._buf.strip():
            self._event(self._buf)
        self._buf = b""

    def _event(self, raw: bytes) -> None:
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in raw.splitlines() if line.startswith(b"data:")
        )
        if not data:
            return
        try:
            ev = json.loads(data)
        except ValueError:
            return
        if isinstance(ev, dict):
            (self._anthropic if self.api == ANTHROPIC else self._responses)(ev)

    def _anthropic(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind == "content_block_delta":
            delta = ev.get("delta") or {}
            for field in ("text", "partial_json", "thinking"):
                value = delta.get(field)
                if isinstance(value, str):
                    self.out_chars += len(value)
        elif kind == "message_start":
            message = ev.get("message") or {}
            self.model = message.get("model") or self.model
            self._usage(message.get("usage"))
        elif kind == "message_delta":
            self._usage(ev.get("usage"))
        elif kind == "message_stop":
            self.final = True

    def _responses(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind in _OUTPUT_DELTAS:
            delta = ev.get("delta")
            if isinstance(delta, str):
                self.out_chars += len(delta)
        elif kind in _RESPONSES_FINAL:
            response = ev.get("response") or {}
            self.model = response.get("model") or self.model
            if response.get("usage"):
                self._usage(response["usage"])
                self.final = True

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if self.api == ANTHROPIC:
            parts = [
                usage.get(k)
                for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            ]
            if any(isinstance(p, int) for p in parts):
                self.tokens_in = sum(p for p in parts if isinstance(p, int))
                cached = usage.get("cache_read_input_tokens")
                self.cached_in = cached if isinstance(cached, int) else self.cached_in
        elif isinstance(usage.get("input_tokens"), int):
            self.tokens_in = usage["input_tokens"]
            details = usage.get("input_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            self.cached_in = cached if isinstance(cached, int) else 0
        out = usage.get("output_tokens")
        if isinstance(out, int):
            self.reported_out = out


def refusal(api: str, message: str, *, streaming: bool, status: int = 400) -> tuple[int, bytes]:
    """An error the CLI understands, (HTTP status, body): mid-stream an SSE error event (the
    HTTP status has already gone), else a JSON error in the provider's shape."""
    if api == ANTHROPIC:
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        body = {"type": "error", "error": {"type": kind, "message": message}}
        if streaming:
            return 200, f"event: error\ndata: {json.dumps(body)}\n\n".encode()
        return status, json.dumps(body).encode()
    error = {
        "code": "corral_budget_exceeded" if status < 500 else "corral_unavailable",
        "message": message,
        "type": "invalid_request" if status < 500 else "server_error",
    }
    if streaming:
        ev = {
            "type": "response.failed",
            "sequence_number": 1_000_000,
            "response": {
                "id": "resp_corral",
                "object": "response",
                "status": "failed",
                "error": error,
                "output": [],
            },
        }
        return 200, f"event: response.failed\ndata: {json.dumps(ev)}\n\n".encode()
    return status, json.dumps({"error": error}).encode()
