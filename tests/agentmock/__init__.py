"""Loopback mocks of the model APIs that coding-agent CLIs call, for tests that run the real CLIs.

Two stdlib-only mocks, each a threaded HTTP server on ``127.0.0.1`` (port 0), usable as a
context manager::

    with AnthropicMock(script) as m:          # Claude Code: ANTHROPIC_BASE_URL=m.url
        ...
    with OpenAIResponsesMock(script, dialect="codex") as m:     # Codex: base_url=m.url + "/v1"
    with OpenAIResponsesMock(script, dialect="opencode") as m:  # OpenCode: baseURL=m.url + "/v1"

Script format (shared by both mocks)
------------------------------------
A list of dicts, one per *model turn* (one API round trip that the agent loop makes)::

    {"text": str,                         # optional assistant text (before any tool calls)
     "tool_calls": [{"name": str, "input": {...}}, ...],   # optional; several = a storm
     "usage": {"input_tokens": int, "output_tokens": int}, # optional (defaults 100 / 20)
     "delay_s": float,                    # optional: wait this long before answering
     "wait_for": str,                     # optional: answer once this file exists
     "hang": bool,                        # optional: accept the request, never answer
     "status": int,                       # optional: answer with this HTTP error instead
     "message": str,                      #   and this error message (the API's own shape)
     "loop": bool,                        # optional: repeat this turn forever
     "stall_s": float,                    # optional: after the first SSE event, wait this long
     "repeat": int}                       # optional: stream the text delta this many times
                                          #   (a token explosion: len(text) * repeat chars)

A ``status`` turn is the model API failing: 401 (bad credentials), 404 (unknown model), 429
(rate limited), 500/529 (the provider's trouble). The CLIs retry some of these themselves
(Claude Code: ``CLAUDE_CODE_MAX_RETRIES``), each retry consuming a turn unless it loops.

Tool names are given in Claude Code terms and mapped to each CLI's native tool; the mapping
may depend on the tools the request offers:

* ``Bash{"command"}`` -> Codex ``exec_command{"cmd"}``; OpenCode ``bash{"command",
  "description"}`` (description defaults to "run a command").
* ``Read{"file_path"}`` -> Codex ``exec_command{"cmd": "cat <path>"}``; OpenCode
  ``read{"filePath"}``.
* ``Write{"file_path","content"}`` / ``Edit{"file_path","old_string","new_string"}`` -> an
  ``*** Begin Patch`` envelope: Codex gets a freeform ``custom_tool_call`` ``apply_patch`` when the
  request offers that tool (model slugs Codex knows, e.g. ``gpt-5.5``), else ``exec_command`` with
  ``apply_patch <<'PATCH' ...`` (Codex intercepts it; unknown slugs such as ``gpt-5`` offer no
  apply_patch tool). OpenCode gets ``apply_patch{"patchText"}`` when it offers ``apply_patch`` but
  not ``write``/``edit`` (its GPT models), else ``write{"filePath","content"}`` /
  ``edit{"filePath","oldString","newString"}``.

Claude Code gets the names unchanged. Any other name is passed through unchanged with its input
as given, so a script may use a CLI's native tool name directly (e.g. ``{"name": "glob",
"input": {"pattern": "*"}}`` for OpenCode).

Turns are consumed in order, per mock. A turn with ``"loop": True`` is never consumed (every
later request gets it again: a planning-loop agent). When the script is exhausted the mock
answers with the plain final text ``"done"``. ``hang`` requests are released (the connection
is closed without an answer) by :meth:`close`, which therefore never blocks on them.

Auxiliary requests
------------------
The CLIs make side calls that must not consume scripted turns. A request is a *turn* iff its
JSON body has a non-empty ``tools`` list; everything else is *auxiliary* and gets a canned
answer:

* Claude Code 2.1.330 in ``-p`` mode made no side calls in our runs (every request had the
  12 tools). Should one come (a ``/v1/messages`` body without ``tools``, e.g. a title request on
  the small model) it gets a short text, or ``{"title": ...}`` JSON when it asks for JSON;
  ``POST /v1/messages/count_tokens`` gets ``{"input_tokens": 100}``; any ``GET`` gets an empty
  list.
* OpenCode 1.18.33: the title-generation request to the small model (``gpt-5.4-nano`` for
  the ``openai`` provider) has no ``tools``; answered with a short title text.
* Codex 0.169.0 made no side calls in our runs. With a model slug that has "code mode"
  metadata (e.g. ``gpt-6.1-sol``) it sends no ``tools`` at all but an ``additional_tools`` input
  item (a JavaScript ``exec`` tool); such requests count as auxiliary here, so use ``gpt-5.5``.

Every POST body is recorded: ``m.requests`` (all, parsed JSON, in arrival order),
``m.turn_requests`` (only the ones treated as turns), ``m.aux_requests``; ``m.log`` has
``(method, path, kind, body)`` tuples for everything, including GETs; ``m.turns_consumed`` counts
scripted turns used; ``m.errors`` holds exceptions raised inside the mock (answered with HTTP 500,
never a dropped connection, because a dropped connection makes the CLIs silently retry).
``delay_s`` is applied before any byte of the answer; a hung request gets no bytes at all.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["AnthropicMock", "MockServer", "OpenAIResponsesMock", "Turn", "tool_names"]

Turn = dict[str, Any]
FINAL_TEXT = "done"
DEFAULT_USAGE = {"input_tokens": 100, "output_tokens": 20}


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    mock: MockServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr
        pass

    def setup(self) -> None:
        # a kept connection's small writes must not wait for the peer's delayed ACK (Nagle),
        # as no provider's do
        self.disable_nagle_algorithm = self.server.mock.keep_alive
        super().setup()

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if raw and self.headers.get("Content-Encoding", "") in ("gzip",):
            import gzip

            raw = gzip.decompress(raw)
        if raw and self.headers.get("Content-Encoding", "") == "zstd":  # pragma: no cover
            raise ValueError("zstd request bodies are not supported")
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return {"_raw": raw.decode("utf-8", "replace")}

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def _dispatch(self, method: str) -> None:
        try:
            self.server.mock._handle(self, method, self._body() if method == "POST" else None)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a mock bug must be loud, not a dropped connection + retry
            traceback.print_exc()
            self.server.mock.errors.append(e)
            try:
                self.send_json({"error": {"type": "mock_error", "message": repr(e)}}, 500)
            except OSError:
                self.close_connection = True

    # --- response helpers used by the mocks ---
    def send_json(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_sse(self, events: Iterator[tuple[str, dict[str, Any]]], stall_s: float = 0) -> None:
        keep = self.server.mock.keep_alive
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if keep:  # as providers answer: chunked, the connection kept for the next request
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        for i, (name, data) in enumerate(events):
            event = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event) if keep else event)
            self.wfile.flush()
            if i == 0 and stall_s and self.server.mock._closing.wait(stall_s):
                self.close_connection = True
                return
        if keep:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()


class MockServer:
    """Shared machinery: threaded loopback server, script cursor, request log."""

    def __init__(self, script: Sequence[Turn] = (), keep_alive: bool = False) -> None:
        self.script: list[Turn] = [dict(t) for t in script]
        self.keep_alive = keep_alive  # SSE answers chunked on kept connections (else: close)
        self.requests: list[Any] = []
        self.turn_requests: list[Any] = []
        self.aux_requests: list[Any] = []
        self.log: list[tuple[str, str, str, Any]] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._next = 0
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---
    def start(self) -> MockServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.mock = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "mock not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closing.set()  # releases hung / delayed handlers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MockServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- script ---
    def next_turn(self) -> Turn:
        """The next scripted turn (thread-safe); a ``loop`` turn is never consumed."""
        with self._lock:
            if self._next >= len(self.script):
                return {"text": FINAL_TEXT}
            turn = self.script[self._next]
            if not turn.get("loop"):
                self._next += 1
            return turn

    @property
    def turns_consumed(self) -> int:
        with self._lock:
            return self._next

    def _record(self, method: str, path: str, kind: str, body: Any) -> None:
        with self._lock:
            self.log.append((method, path, kind, body))
            if method == "POST":
                self.requests.append(body)
                (self.turn_requests if kind == "turn" else self.aux_requests).append(body)

    def _wait_or_hang(self, turn: Turn, handler: _Handler) -> bool:
        """Apply ``delay_s``/``wait_for``/``hang``; False when the request must get no answer."""
        delay = float(turn.get("delay_s") or 0)
        if delay and self._closing.wait(delay):
            return False
        wait_for = turn.get("wait_for")
        while wait_for and not os.path.exists(wait_for):  # a condition the test makes true
            if self._closing.wait(0.02):
                return False
        if turn.get("hang"):
            self._closing.wait()
            handler.close_connection = True
            return False
        return True

    def _failed(self, turn: Turn, handler: _Handler) -> bool:
        """Answer a ``status`` turn with its HTTP error; False when the turn is not one."""
        status = turn.get("status")
        if not status:
            return False
        message = str(turn.get("message") or f"mock {status}")
        handler.send_json(self.error_body(int(status), message), int(status))
        return True

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "mock_error", "code": status}}

    @staticmethod
    def is_turn(body: Any) -> bool:
        return isinstance(body, dict) and bool(body.get("tools"))

    def _handle(self, handler: _Handler, method: str, body: Any) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Anthropic Messages API (Claude Code)
# ---------------------------------------------------------------------------------------------


_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class AnthropicMock(MockServer):
    """Anthropic Messages API: ``POST /v1/messages[?beta=true]`` (SSE or JSON)."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _ANTHROPIC_ERRORS.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _handle(self, handler: _Handler, method: str, body: Any) -> None:
        path = handler.path.split("?", 1)[0]
        if method == "GET":
            self._record(method, handler.path, "aux", None)
            handler.send_json({"data": [], "has_more": False})
            return
        if path.endswith("/count_tokens"):
            self._record(method, handler.path, "aux", body)
            handler.send_json({"input_tokens": 100})
            return
        if not path.endswith("/v1/messages"):
            self._record(method, handler.path, "aux", body)
            handler.send_json({})
            return
        if self.is_turn(body):
            self._record(method, handler.path, "turn", body)
            turn = self.next_turn()
            if not self._wait_or_hang(turn, handler) or self._failed(turn, handler):
                return
        else:
            self._record(method, handler.path, "aux", body)
            turn = {"text": _aux_text(body), "usage": {"input_tokens": 10, "output_tokens": 5}}
        model = (body or {}).get("model") or "claude-sonnet-4-5"
        blocks = _anthropic_blocks(turn)
        usage = {**DEFAULT_USAGE, **(turn.get("usage") or {})}
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        if (body or {}).get("stream"):
            handler.send_sse(
                _anthropic_events(model, blocks, usage, stop, int(turn.get("repeat") or 1)),
                float(turn.get("stall_s") or 0),
            )
        else:
            handler.send_json(_anthropic_message(model, blocks, usage, stop))


def _aux_text(body: Any) -> str:
    """Canned answer for a side call: JSON if the request seems to ask for JSON."""
    text = json.dumps(body)[:20000].lower()
    if "title" in text and "json" in text:
        return json.dumps({"title": "Mock session", "isNewTopic": False})
    if "title" in text:
        return "Mock session"
    return FINAL_TEXT


def _anthropic_blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.get("text"):
        blocks.append({"type": "text", "text": str(turn["text"])})
    for call in turn.get("tool_calls") or ():
        blocks.append(
            {
                "type": "tool_use",
                "id": _id("toolu_"),
                "name": call["name"],
                "input": dict(call.get("input") or {}),
            }
        )
    if not blocks:
        blocks.append({"type": "text", "text": FINAL_TEXT})
    return blocks


def _anthropic_message(
    model: str, blocks: list[dict[str, Any]], usage: dict[str, int], stop: str
) -> dict[str, Any]:
    return {
        "id": _id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage["input_tokens"],
            "output_tokens": usage["output_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _anthropic_events(
    model: str,
    blocks: list[dict[str, Any]],
    usage: dict[str, int],
    stop: str,
    repeat: int = 1,
) -> Iterator[tuple[str, dict[str, Any]]]:
    message = _anthropic_message(model, [], usage, stop)
    message.update(stop_reason=None)
    message["usage"] = dict(message["usage"], output_tokens=1)
    yield "message_start", {"type": "message_start", "message": message}
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": start,
            },
        )
        for _ in range(repeat if block["type"] == "text" else 1):
            yield (
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


# ---------------------------------------------------------------------------------------------
# OpenAI Responses API (Codex, OpenCode)
# ---------------------------------------------------------------------------------------------


class OpenAIResponsesMock(MockServer):
    """OpenAI Responses API: ``POST /v1/responses`` (SSE).

    ``dialect`` selects the tool-name mapping: ``"codex"`` or ``"opencode"``.
    """

    def __init__(
        self, script: Sequence[Turn] = (), dialect: str = "codex", keep_alive: bool = False
    ) -> None:
        if dialect not in ("codex", "opencode"):
            raise ValueError(f"unknown dialect {dialect!r}")
        super().__init__(script, keep_alive)
        self.dialect = dialect

    def _handle(self, handler: _Handler, method: str, body: Any) -> None:
        path = handler.path.split("?", 1)[0]
        if method == "GET":
            self._record(method, handler.path, "aux", None)
            handler.send_json({"object": "list", "data": [], "models": []})
            return
        if not path.endswith("/responses"):
            self._record(method, handler.path, "aux", body)
            handler.send_json({"error": {"message": f"mock: no route {path}"}}, 404)
            return
        if self.is_turn(body):
            self._record(method, handler.path, "turn", body)
            turn = self.next_turn()
            if not self._wait_or_hang(turn, handler) or self._failed(turn, handler):
                return
        else:
            self._record(method, handler.path, "aux", body)
            turn = {"text": "Mock session", "usage": {"input_tokens": 10, "output_tokens": 5}}
        model = (body or {}).get("model") or "gpt-5"
        offered = tool_names(body)
        items = [self._native(call, offered) for call in turn.get("tool_calls") or ()]
        text = turn.get("text") or ("" if items else FINAL_TEXT)
        usage = {**DEFAULT_USAGE, **(turn.get("usage") or {})}
        handler.send_sse(
            _responses_events(model, text, items, usage, int(turn.get("repeat") or 1)),
            float(turn.get("stall_s") or 0),
        )

    def _native(self, call: dict[str, Any], offered: set[str]) -> dict[str, Any]:
        """Map a Claude-terms tool call to this dialect's function/custom tool call item."""
        name, args = call["name"], dict(call.get("input") or {})
        if self.dialect == "codex":
            return _codex_call(name, args, offered)
        return _function_call(*_opencode_call(name, args, offered))


def tool_names(body: Any) -> set[str]:
    """The tool names a request offers the model."""
    names: set[str] = set()
    for tool in (body or {}).get("tools") or ():
        if isinstance(tool, dict) and tool.get("name"):
            names.add(str(tool["name"]))
    return names


def _patch(name: str, args: dict[str, Any]) -> str:
    """An apply_patch envelope for a Claude ``Write`` / ``Edit`` call."""
    if name == "Write":
        lines = str(args.get("content", "")).splitlines() or [""]
        body = [f"*** Add File: {args['file_path']}"] + [f"+{line}" for line in lines]
    else:
        body = [f"*** Update File: {args['file_path']}", "@@"]
        body += [f"-{line}" for line in str(args["old_string"]).splitlines()]
        body += [f"+{line}" for line in str(args["new_string"]).splitlines()]
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


def _function_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": _id("fc_"),
        "call_id": _id("call_"),
        "name": name,
        "arguments": json.dumps(args),
    }


def _codex_call(name: str, args: dict[str, Any], offered: set[str]) -> dict[str, Any]:
    if name == "Bash":
        return _function_call("exec_command", {"cmd": args["command"]})
    if name == "Read":
        return _function_call("exec_command", {"cmd": f"cat {_sh_quote(args['file_path'])}"})
    if name in ("Write", "Edit"):
        patch = _patch(name, args)
        if "apply_patch" in offered:  # freeform tool (known model such as gpt-5.5)
            return _custom_call("apply_patch", patch)
        # unknown model slug: codex offers no apply_patch tool, the shell form is intercepted
        return _function_call("exec_command", {"cmd": f"apply_patch <<'PATCH'\n{patch}\nPATCH"})
    if name.startswith("mcp__"):  # Codex defers MCP tools: a call names the server's namespace
        namespace, _, tool = name.rpartition("__")
        return {**_function_call(tool, args), "namespace": namespace}
    return _function_call(name, args)


def _custom_call(name: str, text: str) -> dict[str, Any]:
    return {
        "type": "custom_tool_call",
        "id": _id("ctc_"),
        "call_id": _id("call_"),
        "name": name,
        "input": text,
    }


def _opencode_call(
    name: str, args: dict[str, Any], offered: set[str]
) -> tuple[str, dict[str, Any]]:
    if name == "Bash":
        return "bash", {
            "command": args["command"],
            "description": args.get("description") or "run a command",
        }
    if name == "Read":
        return "read", {"filePath": args["file_path"]}
    if name in ("Write", "Edit") and "apply_patch" in offered and name.lower() not in offered:
        return "apply_patch", {"patchText": _patch(name, args)}  # GPT models get apply_patch
    if name == "Write":
        return "write", {"filePath": args["file_path"], "content": args.get("content", "")}
    if name == "Edit":
        return "edit", {
            "filePath": args["file_path"],
            "oldString": args["old_string"],
            "newString": args["new_string"],
        }
    if name.startswith("mcp__"):  # OpenCode names an MCP tool `<server>_<tool>`
        return name[len("mcp__") :].replace("__", "_", 1), args
    return name, args


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _responses_events(
    model: str,
    text: str,
    calls: list[dict[str, Any]],
    usage: dict[str, int],
    repeat: int = 1,
) -> Iterator[tuple[str, dict[str, Any]]]:
    seq = iter(range(1_000_000))
    resp_id = _id("resp_")
    base = {
        "id": resp_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "output": [],
    }

    def ev(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(seq), **fields}

    yield ev("response.created", response={**base, "status": "in_progress"})
    yield ev("response.in_progress", response={**base, "status": "in_progress"})
    output: list[dict[str, Any]] = []
    if text:
        index = len(output)
        item_id = _id("msg_")
        part = {"type": "output_text", "text": "", "annotations": []}
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant"}
        yield ev("response.output_item.added", output_index=index, item={**item, "content": []})
        yield ev(
            "response.content_part.added",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=part,
        )
        for _ in range(repeat):
            yield ev(
                "response.output_text.delta",
                item_id=item_id,
                output_index=index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        yield ev(
            "response.output_text.done",
            item_id=item_id,
            output_index=index,
            content_index=0,
            text=text,
            logprobs=[],
        )
        done_part = {**part, "text": text}
        yield ev(
            "response.content_part.done",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=done_part,
        )
        done = {**item, "status": "completed", "content": [done_part]}
        output.append(done)
        yield ev("response.output_item.done", output_index=index, item=done)
    for call in calls:
        index = len(output)
        # function calls stream `arguments`; custom (freeform) tool calls stream `input`
        if call["type"] == "function_call":
            family, field = "response.function_call_arguments", "arguments"
        else:
            family, field = "response.custom_tool_call_input", "input"
        yield ev(
            "response.output_item.added",
            output_index=index,
            item={**call, "status": "in_progress", field: ""},
        )
        yield ev(f"{family}.delta", item_id=call["id"], output_index=index, delta=call[field])
        yield ev(f"{family}.done", item_id=call["id"], output_index=index, **{field: call[field]})
        done = {**call, "status": "completed"}
        output.append(done)
        yield ev("response.output_item.done", output_index=index, item=done)
    yield ev(
        "response.completed",
        response={
            **base,
            "status": "completed",
            "output": output,
            "usage": {
                "input_tokens": usage["input_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage["output_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["input_tokens"] + usage["output_tokens"],
            },
        },
    )
