"""The model gateway against the loopback model stand-ins: tokens, metering, budgets, coalescing.

The gateway runs in this process (as in the engine); requests come from worker threads over real
loopback HTTP, as a CLI's would.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from corral.domain.models import Limits
from corral.domain.settings import BreakerSpec, GatewaySpec, RoleSpec, Settings, WorkerSpec
from corral.runtime.modelgate import ModelGateway, idempotency_key
from corral.workers.modelgate import read_endpoint
from corral.workers.modelmeter import ANTHROPIC, OPENAI, CallMeter
from tests.agentmock import AnthropicMock, OpenAIResponsesMock

REAL_KEY = "sk-real-provider-key-0123456789"
TOOLS = [{"type": "function", "name": "exec_command", "parameters": {}}]


class World:
    def __init__(self, gw: ModelGateway, jobs: dict[str, Any]) -> None:
        self.gw = gw
        self.jobs = jobs
        self.stops: list[tuple[str, str]] = []

    def token(self, job_id: str, index: int = 1) -> str:
        assert self.gw.endpoint is not None
        return self.gw.endpoint.token(f"{job_id}.{index}", f"permit-{job_id}-{index}")

    def add(self, job_id: str, index: int = 1, **limits: Any) -> None:
        self.jobs[job_id] = SimpleNamespace(
            job=SimpleNamespace(id=job_id, worker="w", role="r", limits=Limits(**limits)),
            attempt=SimpleNamespace(index=index),
            permit=SimpleNamespace(id=f"permit-{job_id}-{index}"),
        )


@asynccontextmanager
async def gateway(
    tmp_path: Path,
    upstream: str,
    api: str = OPENAI,
    linger_s: float = 30.0,
    fallback_models: tuple[str, ...] = (),
) -> AsyncIterator[World]:
    spec = WorkerSpec(
        name="w",
        adapter="codex" if api == OPENAI else "claude-code",
        env={"REAL_KEY": REAL_KEY},
        gateway=GatewaySpec(upstream=upstream, key_env="REAL_KEY"),
    )
    jobs: dict[str, Any] = {}
    world: World

    async def stop(job_id: str, limit: str, grace: float) -> None:
        world.stops.append((job_id, limit))

    settings = Settings(
        roles={"r": RoleSpec(name="r", fallback_models=fallback_models)},
        environments={},
        workers={"w": spec},
        breakers=BreakerSpec(consecutive_failures=2, open_s=3600),
    )
    gw = ModelGateway(
        settings=settings, data_dir=tmp_path, live=jobs.get, stop=stop, linger_s=linger_s
    )
    world = World(gw, jobs)
    async with anyio.create_task_group() as tg:
        await tg.start(gw.serve)
        yield world
        tg.cancel_scope.cancel()


def post(
    url: str, body: dict[str, Any], token: str, path: str = "/v1/responses", api: str = OPENAI
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    headers.update(
        {"x-api-key": token} if api == ANTHROPIC else {"Authorization": f"Bearer {token}"}
    )
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await anyio.to_thread.run_sync(fn)


def turn_body(text: str = "hello") -> dict[str, Any]:
    return {
        "model": "gpt-5.5",
        "stream": True,
        "tools": TOOLS,
        "input": [{"role": "user", "content": text}],
        "prompt_cache_key": "volatile",
    }


def events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in raw.splitlines() if line.startswith(b"data:")]


@pytest.mark.anyio
async def test_forwards_with_the_provider_key_and_meters_the_answer(tmp_path: Path) -> None:
    with OpenAIResponsesMock(
        [{"text": "hi", "usage": {"input_tokens": 1234, "output_tokens": 56}}]
    ) as mock:
        async with gateway(tmp_path, mock.url) as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            status, raw = await in_thread(lambda: post(url, turn_body(), w.token("j1")))
            assert status == 200
            assert events(raw)[-1]["type"] == "response.completed"
            usage = w.gw.usage("j1", 1)
            assert usage is not None
            assert usage.totals()[:2] == (1234, 56)
            assert usage.requests == 1 and usage.upstream_calls == 1
            assert usage.totals()[2] > 0  # priced (gpt-5 family)
            assert len(mock.turn_requests) == 1


@pytest.mark.anyio
async def test_the_upstream_gets_the_real_key_and_never_the_token(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    class Upstream(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"usage": {"input_tokens": 3, "output_tokens": 4}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        async with gateway(
            tmp_path, f"http://127.0.0.1:{server.server_address[1]}/base", api=ANTHROPIC
        ) as w:
            w.add("j1")
            token = w.token("j1")
            status, raw = await in_thread(
                lambda: post(
                    read_endpoint(tmp_path).url,
                    {"model": "claude-sonnet-4-5", "messages": []},
                    token,
                    path="/v1/messages",
                    api=ANTHROPIC,
                )
            )
            assert status == 200, raw
            [headers] = seen
            assert headers["x-api-key"] == REAL_KEY
            assert token not in json.dumps(headers)
            usage = w.gw.usage("j1", 1)
            assert usage is not None and usage.totals()[:2] == (3, 4)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.anyio
async def test_a_token_works_only_for_its_live_attempt(tmp_path: Path) -> None:
    with OpenAIResponsesMock([]) as mock:
        async with gateway(tmp_path, mock.url) as w:
            url = read_endpoint(tmp_path).url
            w.add("j1")
            forged = w.token("j1")[:-4] + "0000"
            for token in ("sk-anything", forged, w.token("j1", index=2)):
                status, raw = await in_thread(lambda t=token: post(url, turn_body(), t))
                assert status == 401, raw
                assert "Corral gateway" in json.loads(raw)["error"]["message"]
            good = w.token("j1")
            assert (await in_thread(lambda: post(url, turn_body(), good)))[0] == 200
            del w.jobs["j1"]  # the attempt ended: its token is revoked with it
            assert (await in_thread(lambda: post(url, turn_body(), good)))[0] == 401
            assert len(mock.turn_requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("api", [OPENAI, ANTHROPIC])
async def test_a_token_explosion_is_cut_at_the_output_budget(tmp_path: Path, api: str) -> None:
    explosion = {
        "text": "x" * 1000,
        "repeat": 5000,  # 5,000,000 chars
        "usage": {"input_tokens": 100, "output_tokens": 1_250_000},
    }
    mock = OpenAIResponsesMock([explosion]) if api == OPENAI else AnthropicMock([explosion])
    path = "/v1/responses" if api == OPENAI else "/v1/messages"
    body = (
        turn_body()
        if api == OPENAI
        else {
            "model": "claude-sonnet-4-5",
            "stream": True,
            "tools": [{"name": "Bash"}],
            "messages": [{"role": "user", "content": "go"}],
        }
    )
    with mock:
        async with gateway(tmp_path, mock.url, api=api) as w:
            w.add("j1", token_budget_out=10_000)
            url = read_endpoint(tmp_path).url
            status, raw = await in_thread(lambda: post(url, body, w.token("j1"), path, api))
            assert status == 200
            last = events(raw)[-1]
            assert last["type"] == ("response.failed" if api == OPENAI else "error")
            assert "token_budget_out" in json.dumps(last)
            assert len(raw) < 200_000  # cut near 10,000 tokens (40,000 chars), not 5 MB
            assert w.stops == [("j1", "token_budget_out")]
            usage = w.gw.usage("j1", 1)
            assert usage is not None and usage.limit_hit == "token_budget_out"
            assert 10_000 < usage.totals()[1] < 50_000
            # every later call of the attempt is refused at once, upstream never asked
            status, raw = await in_thread(lambda: post(url, body, w.token("j1"), path, api))
            assert status == 400 and b"token_budget_out" in raw
            assert len(mock.turn_requests) == 1


@pytest.mark.anyio
async def test_identical_calls_in_flight_share_one_upstream_call(tmp_path: Path) -> None:
    with OpenAIResponsesMock([{"text": "same answer", "delay_s": 1.0}]) as mock:
        async with gateway(tmp_path, mock.url) as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            answers: list[tuple[int, bytes]] = []

            async def call(cache_key: str) -> None:
                body = {**turn_body(), "prompt_cache_key": cache_key}
                answers.append(await in_thread(lambda: post(url, body, w.token("j1"))))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "a")
                tg.start_soon(call, "b")
            assert len(mock.turn_requests) == 1
            assert [a[0] for a in answers] == [200, 200] and answers[0][1] == answers[1][1]
            usage = w.gw.usage("j1", 1)
            assert usage is not None
            assert (usage.requests, usage.upstream_calls, usage.coalesced) == (2, 1, 1)
            # a different prompt is a different call
            status, _ = await in_thread(lambda: post(url, turn_body("other"), w.token("j1")))
            assert status == 200 and len(mock.turn_requests) == 2


@pytest.mark.anyio
async def test_a_retry_of_an_abandoned_call_gets_its_answer(tmp_path: Path) -> None:
    """A CLI that timed out and retried: the next attempt of the job joins the call in flight."""
    with OpenAIResponsesMock([{"text": "slow answer", "delay_s": 1.5}]) as mock:
        async with gateway(tmp_path, mock.url) as w:
            w.add("j1", index=1)
            url = read_endpoint(tmp_path).url

            def impatient() -> None:
                req = urllib.request.Request(
                    url + "/v1/responses",
                    data=json.dumps(turn_body()).encode(),
                    headers={"Authorization": f"Bearer {w.token('j1', 1)}"},
                )
                with pytest.raises(TimeoutError):
                    urllib.request.urlopen(req, timeout=0.3).read()

            await in_thread(impatient)
            w.add("j1", index=2)  # the job's next attempt asks the same
            status, raw = await in_thread(lambda: post(url, turn_body(), w.token("j1", 2)))
            assert status == 200 and b"slow answer" in raw
            assert len(mock.turn_requests) == 1
            second = w.gw.usage("j1", 2)
            assert second is not None and second.coalesced == 1
            assert second.totals()[:2] == (100, 20)  # the attempt that got the answer pays


def test_the_idempotency_key_ignores_volatile_fields_and_hashes_tools() -> None:
    a = idempotency_key(OPENAI, "gpt-5.5", {**turn_body(), "prompt_cache_key": "x"})
    b = idempotency_key(OPENAI, "gpt-5.5", {**turn_body(), "prompt_cache_key": "y"})
    c = idempotency_key(OPENAI, "gpt-5.5", {**turn_body(), "tools": []})
    provider, model, prompt, tools = a.split(":")
    assert (provider, model) == ("openai", "gpt-5.5") and len(prompt) == len(tools) == 32
    assert a == b and a.split(":")[2] == c.split(":")[2] and a != c


def test_output_is_estimated_by_chars_until_the_final_usage() -> None:
    m = CallMeter(api=OPENAI, request_chars=400)
    m.feed(
        b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
        b'"delta": "' + b"y" * 41 + b'"}\n\n'
    )
    assert (m.input_tokens, m.output_tokens) == (100, 11)  # ceil(41 / 4); input from the body
    m.feed(
        b'data: {"type": "response.completed", "response": {"usage": {"input_tokens": 7, '
        b'"output_tokens": 3}}}\n\n'
    )
    assert (m.input_tokens, m.output_tokens, m.final) == (7, 3, True)
    a = CallMeter(api=ANTHROPIC)
    a.feed(
        b'data: {"type": "message_start", "message": {"model": "claude-sonnet-4-5", "usage":'
        b' {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}}}\n\n'
        b'data: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "ab'
        b'cdefgh"}}\n\n'
    )
    assert (a.input_tokens, a.output_tokens, a.cached_in) == (15, 2, 5)
    a.feed(
        b'data: {"type": "message_delta", "usage": {"output_tokens": 9}}\n\ndata: {"type": '
        b'"message_stop"}\n\n'
    )
    assert a.output_tokens == 9 and a.final


def test_callers_get_whole_sse_events_only() -> None:
    from corral.runtime.modelgate import _whole_events

    assert _whole_events(b'data: {}\n\ndata: {"a') == (b"data: {}\n\n", b'data: {"a')
    assert _whole_events(b"data: {") == (b"", b"data: {")
    assert _whole_events(b"data: 1\r\n\r\ndata") == (b"data: 1\r\n\r\n", b"data")


def test_a_worker_behind_the_gateway_authenticates_with_its_key_env() -> None:
    from corral.workers.credentials import missing

    spec = WorkerSpec(
        name="codex",
        adapter="codex",
        gateway=GatewaySpec(upstream="https://api.openai.com", key_env="PK"),
    )
    assert (
        missing("codex", spec, "gpt-5", ("OPENAI_API_KEY",), {})
        == "PK (gateway.key_env) is not set"
    )
    assert missing("codex", spec, "gpt-5", ("OPENAI_API_KEY",), {"PK": "sk-x"}) is None


def test_the_meter_reads_crlf_events_split_anywhere() -> None:
    raw = (
        b'data: {"type": "response.output_text.delta", "delta": "abcd"}\r\n\r\n'
        b'data: {"type": "response.completed", "response": {"usage": {"input_tokens": 5, '
        b'"output_tokens": 2}}}\r\n\r\n'
    )
    for cut in range(len(raw)):
        m = CallMeter(api=OPENAI)
        m.feed(raw[:cut])
        m.feed(raw[cut:])
        m.end()
        assert (m.input_tokens, m.output_tokens, m.out_chars) == (5, 2, 4), cut


@pytest.mark.anyio
async def test_429s_open_the_models_breaker_and_the_role_falls_back(tmp_path: Path) -> None:
    script = [
        {"status": 429, "message": "slow down"},
        {"status": 429, "message": "slow down"},
        {"text": "from the fallback"},
    ]
    with OpenAIResponsesMock(script) as mock:
        async with gateway(tmp_path, mock.url, fallback_models=("gpt-5-mini",)) as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            for i, expected in enumerate((429, 429)):
                status, _ = await in_thread(
                    lambda i=i: post(url, turn_body(f"a{i}"), w.token("j1"))
                )
                assert status == expected
            status, raw = await in_thread(lambda: post(url, turn_body("b"), w.token("j1")))
            assert status == 200 and b"from the fallback" in raw
            assert [r["model"] for r in mock.turn_requests] == ["gpt-5.5", "gpt-5.5", "gpt-5-mini"]
            states = {b["name"]: b["state"] for b in w.gw.breakers.snapshot(0)}
            assert states["model:gpt-5.5"] == "OPEN" and states["model:gpt-5-mini"] == "CLOSED"
            assert states["provider:" + mock.url.split("//")[1]] == "CLOSED"  # a rate limit
            usage = w.gw.usage("j1", 1)
            assert usage is not None and usage.fallbacks == 1


@pytest.mark.anyio
async def test_an_open_provider_breaker_refuses_without_calling_it(tmp_path: Path) -> None:
    script = [{"status": 503, "message": "down"}, {"status": 503, "message": "down"}]
    with AnthropicMock(script) as mock:
        async with gateway(tmp_path, mock.url, api=ANTHROPIC) as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            body = {
                "model": "claude-sonnet-4-5",
                "stream": True,
                "tools": [{"name": "Bash"}],
                "messages": [{"role": "user", "content": "go"}],
            }
            for i in range(2):
                status, _ = await in_thread(
                    lambda i=i: post(
                        url, {**body, "system": str(i)}, w.token("j1"), "/v1/messages", ANTHROPIC
                    )
                )
                assert status == 503
            status, raw = await in_thread(
                lambda: post(url, body, w.token("j1"), "/v1/messages", ANTHROPIC)
            )
            assert status == 529 and json.loads(raw)["error"]["type"] == "overloaded_error"
            assert "breaker provider:127.0.0.1" in json.loads(raw)["error"]["message"]
            assert len(mock.turn_requests) == 2


def test_a_breaker_probes_after_open_s_and_closes_on_success() -> None:
    from corral.runtime.modelbreakers import ModelBreakers

    board = ModelBreakers(BreakerSpec(consecutive_failures=1, open_s=10))
    names = ("provider:p", "model:m")
    board.record(names, True, now=100)
    assert board.open_one(names, now=105) is not None  # open
    assert board.open_one(names, now=111) is None  # half open: this call is the probe
    board.admitted(names)
    assert board.open_one(names, now=111) is not None  # one probe at a time
    board.record(names, False, now=112)
    assert board.open_one(names, now=112) is None
    assert {b["state"] for b in board.snapshot(112)} == {"CLOSED"}
    board.record(names, None, now=113)  # a 400: says nothing of the provider
    assert {b["state"] for b in board.snapshot(113)} == {"CLOSED"}


def test_the_gateway_configuration_is_read_and_checked(tmp_path: Path) -> None:
    from corral.config import load
    from corral.domain.errors import ConfigError

    path = tmp_path / "corral.yaml"
    path.write_text("""
roles:
  agent: {worker: codex, fallback_models: [gpt-5.4-mini]}
workers:
  codex:
    gateway: {upstream: "https://api.openai.com/", key_env: OPENAI_KEY,
              breakers: {consecutive_failures: 2}}
""")
    settings = load(data_dir=tmp_path / "d", config_path=path).settings
    gw = settings.workers["codex"].gateway
    assert gw is not None and gw.upstream == "https://api.openai.com"
    assert gw.key_env == "OPENAI_KEY" and gw.breakers is not None
    assert gw.breakers.consecutive_failures == 2
    assert settings.roles["agent"].fallback_models == ("gpt-5.4-mini",)
    path.write_text("workers:\n  codex:\n    gateway: {upstream: ftp://x}\n")
    with pytest.raises(ConfigError, match=r"workers\.codex\.gateway\.upstream: .*http\(s\) URL"):
        load(data_dir=tmp_path / "d", config_path=path)


class KeepAlive(BaseHTTPRequestHandler):
    """A provider on HTTP/1.1 keep-alive; `stale` closes each connection after its answer
    without saying so (an idle connection the provider dropped)."""

    protocol_version = "HTTP/1.1"
    stale = False
    connections: set[int] = set()
    requests = 0

    def do_POST(self) -> None:
        type(self).connections.add(id(self.connection))
        type(self).requests += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"usage": {"input_tokens": 3, "output_tokens": 4}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.stale:
            self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.anyio
@pytest.mark.parametrize("stale", [False, True])
async def test_upstream_connections_are_kept_and_a_dropped_one_is_replaced(
    tmp_path: Path, stale: bool
) -> None:
    handler = type("H", (KeepAlive,), {"stale": stale, "connections": set(), "requests": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        async with gateway(
            tmp_path, f"http://127.0.0.1:{server.server_address[1]}", api=ANTHROPIC
        ) as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            for i in range(3):
                status, raw = await in_thread(
                    lambda i=i: post(
                        url,
                        {"model": "claude-sonnet-4-5", "messages": [str(i)]},
                        w.token("j1"),
                        path="/v1/messages",
                        api=ANTHROPIC,
                    )
                )
                assert status == 200, raw
            assert handler.requests == 3  # never sent twice
            pool = w.gw.pool
            if stale:  # each kept connection was found closed, and the call went on a new one
                assert (pool.opened, pool.reused) == (3, 2)
            else:
                assert (pool.opened, pool.reused) == (1, 2)
            usage = w.gw.usage("j1", 1)
            assert usage is not None and usage.totals()[:2] == (9, 12)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.anyio
async def test_a_garbled_upstream_answer_is_a_502_and_the_gateway_keeps_serving(
    tmp_path: Path,
) -> None:
    class Garbled(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"
            )

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbled)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        async with gateway(tmp_path, f"http://127.0.0.1:{server.server_address[1]}") as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            for _ in range(2):  # the second call finds the gateway still serving
                status, raw = await in_thread(lambda: post(url, turn_body(), w.token("j1")))
                assert status == 200 and b"did not answer" in raw
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.anyio
async def test_streamed_answers_on_a_kept_connection_reuse_it(tmp_path: Path) -> None:
    with OpenAIResponsesMock([{"text": "one"}, {"text": "two"}], keep_alive=True) as mock:
        async with gateway(tmp_path, mock.url) as w:
            w.add("j1")
            url = read_endpoint(tmp_path).url
            for text in ("one", "two"):
                status, raw = await in_thread(lambda t=text: post(url, turn_body(t), w.token("j1")))
                assert status == 200 and text.encode() in raw
                assert events(raw)[-1]["type"] == "response.completed"
            assert (w.gw.pool.opened, w.gw.pool.reused) == (1, 1)
            usage = w.gw.usage("j1", 1)
            assert usage is not None and usage.totals()[:2] == (200, 40)


@pytest.mark.anyio
async def test_a_chunked_body_is_read_whole_however_it_is_split() -> None:
    from anyio.streams.buffered import BufferedByteReceiveStream

    from corral.runtime.modelgate import read_body

    body = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: 1\r\n\r\n"
    for cut in range(1, len(body)):
        send, receive = anyio.create_memory_object_stream[bytes](10)
        await send.send(body[:cut])
        await send.send(body[cut:])
        await send.aclose()
        reader = BufferedByteReceiveStream(receive)
        got = b"".join([c async for c in read_body(reader, [("Transfer-Encoding", "chunked")])])
        assert got == b"hello world!", cut
