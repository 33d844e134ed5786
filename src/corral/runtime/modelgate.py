"""The model gateway: every model call of a governed agent passes through the engine.

A worker with a `gateway` (`workers.<kind>.gateway: {upstream, key_env}`) has its CLI pointed at
this loopback HTTP server (workers/agents/; the URL and token from workers/modelgate.py). For
each request the gateway

* checks the attempt's token (bound to its live permit: it stops working when the attempt ends)
  and forwards the call to the worker's upstream with the provider key it alone holds;
* meters the answer's input and output tokens as its bytes arrive (workers/modelmeter.py) and
  holds the attempt to its `token_budget_in` / `token_budget_out` and its budget ceiling live:
  a call that crosses one is cut, the CLI gets an error in its API's own shape, every later call
  of the attempt is refused, and the attempt is stopped with that `limit_hit`;
* coalesces identical calls of one job (its attempts included) while one is in flight, under the
  key `{provider}:{model}:{promptHash}:{toolStateHash}`: one upstream call, every duplicate gets
  its bytes. An upstream call whose callers all went away (a CLI's client timeout) runs on for
  `LINGER_S`, and the retry that comes meanwhile gets its answer instead of paying again.

The figures per attempt (requests, upstream calls, coalesced, refused; tokens and cost) feed the
governor's live view and the attempt's trace. One request per connection with the CLI
(`Connection: close`); upstream connections are kept open between calls (`Pool`).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream, SocketAttribute, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

from corral.domain.models import Claimed, Job
from corral.domain.settings import BreakerSpec, Settings, WorkerSpec
from corral.policy.prerun import BUDGET_CEILING_LIMIT
from corral.runtime.modelbreakers import ModelBreakers, failed
from corral.workers.agents.base import gateway_key
from corral.workers.modelgate import (
    Endpoint,
    new_endpoint,
    parse_token,
    publish,
    token_valid,
    withdraw,
)
from corral.workers.modelmeter import ANTHROPIC, OPENAI, CallMeter, api_of, refusal
from corral.workers.streams.prices import DEFAULT_PRICES

log = logging.getLogger("corral.modelgate")

LINGER_S = 30.0  # an abandoned upstream call runs on this long for a retry to pick it up
MAX_HEAD = 64 << 10
MAX_BODY = 64 << 20
COST_CHECK_S = 1.0  # how often a running call's cost is held against the budget ceiling
CONNECT_TIMEOUT_S = 30.0
HEAD_TIMEOUT_S = 300.0  # from the request sent to the answer's status line
POOL_PER_HOST = 8  # idle upstream connections kept per provider
IDLE_S = 30.0  # how long one is kept unused
HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "host",
        "accept-encoding",
        "authorization",
        "x-api-key",
        "proxy-authorization",
    }
)
# Request fields that differ between two identical calls (a session id, a cache key): not part
# of the prompt hash
VOLATILE = frozenset(
    {"metadata", "prompt_cache_key", "user", "stream", "store", "safety_identifier", "service_tier"}
)

Live = Callable[[str], Claimed | None]
Stop = Callable[[str, str, float], Awaitable[None]]
Overrun = Callable[[Job, float, float], Awaitable[bool]]


class BadRequest(Exception):
    pass


@dataclass(slots=True)
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass(slots=True)
class Usage:
    """One attempt's model calls through the gateway."""

    job_id: str
    index: int
    requests: int = 0  # model calls the CLI made
    upstream_calls: int = 0  # calls sent to the provider
    coalesced: int = 0  # calls answered by another identical call's answer
    refused: int = 0  # calls refused (a budget crossed, a breaker open) or cut
    fallbacks: int = 0  # calls sent to a fallback model (the role's model's breaker open)
    tokens_in: int = 0  # settled calls
    tokens_out: int = 0
    cost_usd: float = 0.0
    limit_hit: str | None = None
    live: set[Flight] = field(default_factory=set)  # calls in flight that it pays for

    def totals(self) -> tuple[int, int, float]:
        tin, tout, cost = self.tokens_in, self.tokens_out, self.cost_usd
        for f in self.live:
            tin += f.meter.input_tokens
            tout += f.meter.output_tokens
            cost += f.cost()
        return tin, tout, cost

    def to_dict(self) -> dict[str, Any]:
        tin, tout, cost = self.totals()
        return {
            "requests": self.requests,
            "upstream_calls": self.upstream_calls,
            "coalesced": self.coalesced,
            "refused": self.refused,
            "fallbacks": self.fallbacks,
            "tokens_in": tin,
            "tokens_out": tout,
            "cost_usd": round(cost, 6),
            "limit_hit": self.limit_hit,
        }


class Flight:
    """One upstream call and the bytes it has answered so far, for every caller waiting on it."""

    def __init__(
        self,
        key: tuple[str, ...] | None,
        payer: Usage,
        meter: CallMeter,
        breakers: tuple[str, ...] = (),
        spec: BreakerSpec | None = None,
    ) -> None:
        self.key = key
        self.breakers = breakers  # the breakers its result feeds
        self.spec = spec  # and their settings
        self.payer = payer
        self.meter = meter
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []
        self.done = False
        self.delivered = False  # some caller got the whole answer
        self.subscribers = 0
        self.changed = anyio.Event()
        self.scope = anyio.CancelScope()

    def cost(self) -> float:
        m = self.meter
        found = DEFAULT_PRICES.cost_of(
            m.model, m.input_tokens, m.output_tokens, cached_in=m.cached_in, vendor=m.api
        )
        return found or 0.0

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class ModelGateway:
    def __init__(
        self,
        *,
        settings: Settings,
        data_dir: Path,
        live: Live,
        stop: Stop,
        overrun: Overrun | None = None,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] = os.environ,
        linger_s: float = LINGER_S,
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.live = live
        self.stop = stop
        self.overrun = overrun
        self.clock = clock
        self.environ = environ
        self.linger_s = linger_s
        self.endpoint: Endpoint | None = None
        self._usage: dict[tuple[str, int], Usage] = {}
        self._flights: dict[tuple[str, ...], Flight] = {}
        self._tg: TaskGroup | None = None
        self.breakers = ModelBreakers(settings.breakers)
        self.pool = Pool()

    def wanted(self) -> bool:
        return any(w.gateway is not None for w in self.settings.workers.values())

    # ---- life -----------------------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[Endpoint] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(SocketAttribute.local_port)
        self.endpoint = new_endpoint(f"http://127.0.0.1:{port}")
        publish(self.data_dir, self.endpoint)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started(self.endpoint)
                await listener.serve(self._connection, task_group=tg)
        finally:
            withdraw(self.data_dir)
            await listener.aclose()
            await self.pool.close_all()

    def usage(self, job_id: str, index: int) -> Usage | None:
        return self._usage.get((job_id, index))

    def forget(self, job_id: str, index: int) -> Usage | None:
        """The attempt ended: its figures, once (its token already stopped working)."""
        return self._usage.pop((job_id, index), None)

    # ---- one request ------------------------------------------------------------------------

    async def _connection(self, client: ByteStream) -> None:
        async with client:
            reader = BufferedByteReceiveStream(client)
            try:
                req = await read_request(reader)
            except (
                BadRequest,
                ValueError,
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.DelimiterNotFound,
                anyio.BrokenResourceError,
            ) as err:
                with contextlib.suppress(OSError, anyio.BrokenResourceError):
                    await _send_error(client, 400, OPENAI, f"Corral gateway: bad request ({err})")
                return
            api = api_of(req.target) or (ANTHROPIC if req.header("x-api-key") else OPENAI)
            try:
                await self._handle(client, req, api)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the CLI went away
            except Exception as err:  # a bug here must not take the engine down
                log.exception("model gateway: %s %s failed", req.method, req.target)
                with contextlib.suppress(
                    OSError, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    await _send_error(
                        client, 500, api, f"Corral gateway: internal error ({type(err).__name__})"
                    )

    def _attempt(self, req: Request) -> tuple[Claimed, WorkerSpec] | str:
        """The live attempt a request's token names, or why it is refused."""
        auth = req.header("x-api-key") or ""
        bearer = req.header("authorization") or ""
        if bearer.lower().startswith("bearer "):
            auth = auth or bearer[7:].strip()
        found = parse_token(auth)
        if found is None or self.endpoint is None:
            return "Corral gateway: not a gateway token"
        job_id, index, mac = found
        claimed = self.live(job_id)
        if (
            claimed is None
            or str(claimed.attempt.index) != index
            or not token_valid(self.endpoint.key, job_id, index, mac, claimed.permit.id)
        ):
            return "Corral gateway: this token's attempt is not running (tokens end with it)"
        spec = self.settings.workers.get(claimed.job.worker)
        if spec is None or spec.gateway is None:
            return f"Corral gateway: worker {claimed.job.worker} has no gateway"
        return claimed, spec

    async def _handle(self, client: ByteStream, req: Request, api: str) -> None:
        found = self._attempt(req)
        if isinstance(found, str):
            await _send_error(client, 401, api, found)
            return
        claimed, spec = found
        job = claimed.job
        key = (job.id, claimed.attempt.index)
        usage = self._usage.setdefault(key, Usage(job_id=job.id, index=claimed.attempt.index))
        if req.method != "POST" or api_of(req.target) is None:
            flight = Flight(None, usage, CallMeter(api=api, sse=False))
            self._launch(flight, spec, req)  # a side call (model list, token count): unmetered
            await self._relay(client, flight)
            return
        usage.requests += 1
        if (limit := await self._over(usage, job)) is not None:
            usage.refused += 1
            await self._limit(usage, limit)
            await _send_error(client, 400, api, _why(limit, usage, job))
            return
        parsed = _json_body(req)
        model = parsed.get("model") if isinstance(parsed.get("model"), str) else None
        upstream = spec.gateway.upstream if spec.gateway else ""
        role = self.settings.roles.get(job.role)
        provider = f"provider:{urlsplit(upstream).netloc}"
        routed, refused = self._route(provider, model, role.fallback_models if role else ())
        if refused is not None:
            usage.refused += 1
            await _send_error(client, 529 if api == ANTHROPIC else 503, api, refused)
            return
        if routed != model and parsed:  # the role's fallback while its model's breaker is open
            usage.fallbacks += 1
            model = parsed["model"] = routed
            req = Request(
                method=req.method,
                target=req.target,
                body=json.dumps(parsed).encode(),
                headers=[(k, v) for k, v in req.headers if k.lower() != "content-encoding"],
            )
        names = (provider, f"model:{model}") if model else (provider,)
        fkey = (job.id, upstream, idempotency_key(api, model, parsed)) if parsed else None
        joined = self._flights.get(fkey) if fkey else None
        if joined is not None and (not joined.done or not joined.delivered):
            flight = joined
            usage.coalesced += 1
            if flight.done:  # an abandoned answer, now delivered: not kept any longer
                self._flights.pop(fkey or (), None)
            elif flight.payer is not usage and self._job(flight.payer) is None:
                self._move(flight, usage)  # its attempt is over: the one it answers pays
        else:
            flight = Flight(
                fkey,
                usage,
                CallMeter(api=api, model=model, request_chars=len(req.body)),
                names,
                spec.gateway.breakers if spec.gateway else None,
            )
            self.breakers.admitted(names)
            usage.upstream_calls += 1
            usage.live.add(flight)
            if fkey:
                self._flights[fkey] = flight
            self._launch(flight, spec, req)
        await self._relay(client, flight)

    def _move(self, flight: Flight, to: Usage) -> None:
        """A call its attempt abandoned, picked up by a later attempt: the later one pays."""
        flight.payer.live.discard(flight)
        flight.payer = to
        to.live.add(flight)

    def _route(
        self, provider: str, model: str | None, fallbacks: tuple[str, ...]
    ) -> tuple[str | None, str | None]:
        """(the model to send a call to: its own, or the first fallback whose breaker is
        closed; why it cannot go upstream now, if it cannot)."""
        now = self.clock()
        if (b := self.breakers.open_one([provider], now)) is not None:
            return model, _open(b.name, b.retry_after(now))
        if model is None:
            return None, None
        for candidate in (model, *fallbacks):
            if self.breakers.open_one([f"model:{candidate}"], now) is None:
                return candidate, None
        b = self.breakers.get(f"model:{model}")
        return model, _open(b.name, b.retry_after(now), fallbacks)

    async def _over(self, usage: Usage, job: Job, *, cost_too: bool = True) -> str | None:
        if usage.limit_hit is not None:
            return usage.limit_hit
        tin, tout, cost = usage.totals()
        limits = job.limits
        if tout > limits.token_budget_out:
            return "token_budget_out"
        if tin > limits.token_budget_in:
            return "token_budget_in"
        if (
            cost_too
            and cost
            and self.overrun is not None
            and await self.overrun(job, cost, self.clock())
        ):
            return BUDGET_CEILING_LIMIT
        return None

    async def _limit(self, usage: Usage, limit: str) -> None:
        if usage.limit_hit is None:
            usage.limit_hit = limit
            log.info(
                "job %s attempt %d: model calls stopped at %s", usage.job_id, usage.index, limit
            )
        await self.stop(usage.job_id, limit, 0.0)

    # ---- the upstream call --------------------------------------------------------------------

    def _launch(self, flight: Flight, spec: WorkerSpec, req: Request) -> None:
        assert self._tg is not None
        self._tg.start_soon(self._fly, flight, spec, req)

    async def _fly(self, flight: Flight, spec: WorkerSpec, req: Request) -> None:
        assert spec.gateway is not None
        api = flight.meter.api
        with flight.scope:
            try:
                await self._call(flight, spec, req)
            except Exception as err:  # no answer, a garbled one, or a bug: never the engine's end
                if not isinstance(
                    err,
                    (
                        OSError,
                        anyio.EndOfStream,
                        anyio.IncompleteRead,
                        anyio.DelimiterNotFound,
                        anyio.BrokenResourceError,
                        BadRequest,
                        TimeoutError,
                    ),
                ):
                    log.exception("model gateway: the upstream call failed")
                message = f"Corral gateway: the provider did not answer ({err or type(err)})"
                if flight.status is None:
                    flight.status, flight.headers = 502, [("content-type", "application/json")]
                    flight.chunks.append(refusal(api, message, streaming=False, status=502)[1])
                elif flight.meter.sse:
                    flight.chunks.append(refusal(api, message, streaming=True)[1])
        flight.meter.end()
        flight.done = True
        if flight.breakers:  # what the provider's answer says of its health
            outcome = None if flight.scope.cancel_called else failed(flight.status)
            now = self.clock()
            # a 429 is the model's rate limit: the provider's breaker counts the rest
            self.breakers.record(
                flight.breakers[:1], None if flight.status == 429 else outcome, now, flight.spec
            )
            self.breakers.record(flight.breakers[1:], outcome, now, flight.spec)
        self._settle(flight)
        flight.notify()
        keep = not (flight.delivered or flight.status != 200 or flight.subscribers)
        if flight.key and not keep and self._flights.get(flight.key) is flight:
            del self._flights[flight.key]  # kept only for a retry of an abandoned call

    async def _call(self, flight: Flight, spec: WorkerSpec, req: Request) -> None:
        assert spec.gateway is not None
        up = urlsplit(spec.gateway.upstream)
        tls = up.scheme == "https"
        host = up.hostname or "127.0.0.1"
        port = up.port or (443 if tls else 80)
        where = (host, port, tls)
        data = _upstream_request(
            req, up.path.rstrip("/"), up.netloc, flight.meter.api, gateway_key(spec, self.environ)
        )
        while True:
            conn, reused = await self.pool.take(where)
            try:
                await conn.stream.send(data)
                with anyio.fail_after(HEAD_TIMEOUT_S):  # no answer: the provider's failure
                    status, headers = await read_head(conn.reader)
                break
            except (
                OSError,
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
            ):
                await _close(conn)
                if not reused:
                    raise
                # a kept connection the provider had closed meanwhile: again on a new one
        reusable = False
        try:
            reusable = await self._relay_body(flight, conn.reader, status, headers)
        finally:
            if reusable:
                await self.pool.give(where, conn)
            else:
                await _close(conn)

    async def _relay_body(
        self,
        flight: Flight,
        reader: BufferedByteReceiveStream,
        status: int,
        headers: list[tuple[str, str]],
    ) -> bool:
        """Read the answer into the flight as it comes, metered and held to the budgets; True
        when it was read whole and its connection may serve another call."""
        flight.status, flight.headers = status, headers
        ctype = next((v for k, v in headers if k.lower() == "content-type"), "")
        flight.meter.sse = "text/event-stream" in ctype
        flight.notify()
        checked = self.clock()
        pending = b""
        if status in (204, 304) or status < 200:  # no body, whatever the headers say
            return _keep_alive(headers)
        async for chunk in read_body(reader, headers):
            flight.meter.feed(chunk)
            if flight.meter.sse:  # callers get whole events: a cut never splits one
                chunk, pending = _whole_events(pending + chunk)
            if chunk:
                flight.chunks.append(chunk)
                flight.notify()
            if status >= 400:
                continue
            now = self.clock()
            cost_too = now - checked >= COST_CHECK_S
            checked = now if cost_too else checked
            usage = flight.payer
            job = self._job(usage)
            if job is None:
                continue
            if (limit := await self._over(usage, job, cost_too=cost_too)) is not None:
                usage.refused += 1
                message = _why(limit, usage, job)
                flight.chunks.append(
                    refusal(flight.meter.api, message, streaming=flight.meter.sse)[1]
                )
                await self._limit(usage, limit)
                return False  # the rest of the answer is not read: the call is cut
        if pending:
            flight.chunks.append(pending)
        return _keep_alive(headers)

    def _job(self, usage: Usage) -> Job | None:
        claimed = self.live(usage.job_id)
        if claimed is None or claimed.attempt.index != usage.index:
            return None
        return claimed.job

    def _settle(self, flight: Flight) -> None:
        usage = flight.payer
        if flight not in usage.live:
            return
        usage.live.discard(flight)
        if flight.status is not None and flight.status < 400:
            usage.tokens_in += flight.meter.input_tokens
            usage.tokens_out += flight.meter.output_tokens
            usage.cost_usd += flight.cost()

    async def _relay(self, client: ByteStream, flight: Flight) -> None:
        """Send one caller the flight's answer, from its first byte, as it comes."""
        flight.subscribers += 1
        sent = 0
        head = False
        try:
            while True:
                changed = flight.changed
                out = b""
                if not head and flight.status is not None:
                    out, head = _head(flight.status, flight.headers), True
                if head and sent < len(flight.chunks):  # all there is, in one send
                    end = len(flight.chunks)
                    out += b"".join(flight.chunks[sent:end])
                    sent = end
                if out:
                    await client.send(out)
                if flight.done and head and sent == len(flight.chunks):
                    flight.delivered = True
                    return
                await changed.wait()
        finally:
            flight.subscribers -= 1
            if flight.subscribers == 0 and not flight.delivered and self._tg is not None:
                self._tg.start_soon(self._linger, flight)

    async def _linger(self, flight: Flight) -> None:
        """No caller is left: the call runs on (or its answer waits) for a retry, a while."""
        await anyio.sleep(self.linger_s)
        if flight.subscribers == 0 and not flight.delivered:
            flight.scope.cancel()
            if flight.key and self._flights.get(flight.key) is flight:
                del self._flights[flight.key]


@dataclass(slots=True)
class Conn:
    stream: ByteStream
    reader: BufferedByteReceiveStream
    idle_since: float = 0.0


class Pool:
    """Upstream connections kept open between calls (HTTP/1.1 keep-alive; a TLS handshake per
    call would cost a provider's round trips each time), a few per provider, for `IDLE_S`."""

    def __init__(self, per_host: int = POOL_PER_HOST, idle_s: float = IDLE_S) -> None:
        self.per_host = per_host
        self.idle_s = idle_s
        self.opened = 0
        self.reused = 0
        self._idle: dict[tuple[str, int, bool], list[Conn]] = {}

    async def take(self, where: tuple[str, int, bool]) -> tuple[Conn, bool]:
        """A connection to `where` and whether it served a call before."""
        kept = self._idle.get(where) or []
        while kept:
            conn = kept.pop()
            if time.monotonic() - conn.idle_since < self.idle_s:
                self.reused += 1
                return conn, True
            await _close(conn)
        host, port, tls = where
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            stream: ByteStream
            if tls:
                stream = await anyio.connect_tcp(
                    host, port, tls=True, tls_standard_compatible=False
                )
            else:
                stream = await anyio.connect_tcp(host, port)
        self.opened += 1
        return Conn(stream, BufferedByteReceiveStream(stream)), False

    async def close_all(self) -> None:
        for kept in self._idle.values():
            while kept:
                await _close(kept.pop())

    async def give(self, where: tuple[str, int, bool], conn: Conn) -> None:
        kept = self._idle.setdefault(where, [])
        if len(kept) >= self.per_host or conn.reader.buffer:
            await _close(conn)  # more than we keep, or bytes past the answer: not reused
            return
        conn.idle_since = time.monotonic()
        kept.append(conn)


async def _close(conn: Conn) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.aclose_forcefully(conn.stream)


def _keep_alive(headers: list[tuple[str, str]]) -> bool:
    """Whether an answer read whole leaves its connection usable: framed, and not closed."""
    h = {k.lower(): v.lower() for k, v in headers}
    framed = "content-length" in h or "chunked" in h.get("transfer-encoding", "")
    return framed and "close" not in h.get("connection", "")


def idempotency_key(api: str, model: str | None, body: Mapping[str, Any]) -> str:
    """`{provider}:{model}:{promptHash}:{toolStateHash}` of a model call: the prompt is the body
    without its tools and its volatile fields, the tool state the tools offered."""
    prompt = {k: v for k, v in body.items() if k not in VOLATILE and k != "tools"}
    return ":".join((api, model or "-", _digest(prompt), _digest(body.get("tools") or [])))


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """`data` split after its last complete SSE event: (whole events, the rest)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return data[:cut], data[cut:]


def _json_body(req: Request) -> dict[str, Any]:
    raw = req.body
    if (req.header("content-encoding") or "").lower() == "gzip":
        try:
            raw = gzip.decompress(raw)
        except OSError:
            return {}
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _open(name: str, retry_after: float | None, fallbacks: tuple[str, ...] = ()) -> str:
    when = f"; retry in {retry_after:.0f} s" if retry_after is not None else ""
    also = f" (and its fallback models {', '.join(fallbacks)})" if fallbacks else ""
    return f"Corral gateway: breaker {name}{also} is open: the provider is failing{when}"


def _why(limit: str, usage: Usage, job: Job) -> str:
    tin, tout, cost = usage.totals()
    what = {
        "token_budget_out": f"{tout} output tokens (budget {job.limits.token_budget_out})",
        "token_budget_in": f"{tin} input tokens (budget {job.limits.token_budget_in})",
    }.get(limit, f"${cost:.4f} (over its budget ceiling)")
    return f"Corral: this attempt has used {what}; no more model calls are allowed ({limit})"


# ---- HTTP/1.1, the little the gateway needs ---------------------------------------------------


async def read_head(reader: BufferedByteReceiveStream) -> tuple[int, list[tuple[str, str]]]:
    head = await reader.receive_until(b"\r\n\r\n", MAX_HEAD)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise BadRequest(f"not an HTTP answer: {lines[0][:80]!r}")
    return int(parts[1]), _headers(lines[1:])


async def read_request(reader: BufferedByteReceiveStream) -> Request:
    head = await reader.receive_until(b"\r\n\r\n", MAX_HEAD)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"not an HTTP/1.1 request: {lines[0][:80]!r}")
    headers = _headers(lines[1:])
    body = b"".join([c async for c in read_body(reader, headers, request=True)])
    return Request(method=parts[0], target=parts[1], headers=headers, body=body)


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            out.append((name.strip(), value.strip()))
    return out


async def read_body(
    reader: BufferedByteReceiveStream, headers: list[tuple[str, str]], *, request: bool = False
) -> AsyncIterator[bytes]:
    """The body's bytes as they come: chunked, by Content-Length, or (an answer) until close."""
    h = {k.lower(): v for k, v in headers}
    if "chunked" in h.get("transfer-encoding", "").lower():
        async for data in _dechunk(reader):
            yield data
    elif "content-length" in h:
        left = int(h["content-length"])
        if left > MAX_BODY:
            raise BadRequest("body too large")
        while left > 0:
            chunk = await reader.receive(min(left, 65536))
            left -= len(chunk)
            yield chunk
    elif not request:
        while True:
            try:
                yield await reader.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return


async def _dechunk(reader: BufferedByteReceiveStream) -> AsyncIterator[bytes]:
    """A chunked body's data, every whole chunk received so far at once (one SSE event is
    often one chunk: reading them one by one would cost a wake-up each)."""
    buf = b""
    total = 0
    while True:
        pos, out = 0, list[bytes]()
        while (eol := buf.find(b"\r\n", pos)) >= 0:
            size = _chunk_size(buf[pos:eol])
            if size == 0:  # the last chunk, then trailers up to an empty line
                if buf.find(b"\r\n\r\n", eol) < 0:
                    break
                if out:
                    yield b"".join(out)
                return
            if len(buf) < eol + 2 + size + 2:
                break
            out.append(buf[eol + 2 : eol + 2 + size])
            pos = eol + 2 + size + 2
            total += size
        if total > MAX_BODY:
            raise BadRequest("body too large")
        if out:
            yield b"".join(out)
        buf = buf[pos:]
        if len(buf) > MAX_HEAD and buf.find(b"\r\n") < 0:
            raise BadRequest("bad chunk size line")
        buf += await reader.receive(65536)


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";")[0].strip() or b"0", 16)
    except ValueError:
        raise BadRequest(f"bad chunk size {line[:20]!r}") from None


def _upstream_request(req: Request, prefix: str, netloc: str, api: str, key: str | None) -> bytes:
    lines = [f"{req.method} {prefix}{req.target} HTTP/1.1", f"Host: {netloc}"]
    lines += [f"{k}: {v}" for k, v in req.headers if k.lower() not in HOP]
    if key:
        lines.append(f"x-api-key: {key}" if api == ANTHROPIC else f"Authorization: Bearer {key}")
    lines += [f"Content-Length: {len(req.body)}", "Accept-Encoding: identity"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send_error(client: ByteStream, status: int, api: str, message: str) -> None:
    _, body = refusal(api, message, streaming=False, status=status)
    head = _head(status, [("Content-Type", "application/json")])
    await client.send(head[:-2] + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}
