"""`create_app`: the FastAPI app over one store and configuration (docs/reference/http-api.md).

OpenAPI is at `/openapi.json`; `/docs` is a small page of our own that lists the operations
from it, with no script from a CDN (FastAPI's Swagger UI and ReDoc load theirs from one, so
they are off). `/mcp` serves the MCP tools to agents (api/mcp.py). `/healthz` answers while
the process is up; `/readyz` says whether the store answers and an engine serves the data
directory — neither needs a token (they reveal nothing of any tenant)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from corral import __version__
from corral.config import Config
from corral.core.ports import Store
from corral.runtime.control import poke, waker
from corral.schemas import api as bodies
from corral.services import Wake
from corral.services.submissions import KeptSubmissions

from . import (
    dlq,
    epics,
    governance,
    intents,
    jobs,
    knowledge,
    mcp,
    mechanism,
    policy,
    problems,
    records,
    tokens,
    world,
)
from .ratelimit import Buckets
from .state import ApiState

READY_TIMEOUT_S = 1.0
# The largest request body read, in bytes: a bigger one is 413 before it is read whole (without
# a limit any caller, a token or none, could make the engine hold a body of any size in memory).
# A job fits one core protocol line (1 MiB, core/protocol.py) and an epic's text 256 KiB; four
# times the former leaves room for any valid body written out in escaped JSON.
MAX_BODY_BYTES = 4 << 20
# Builds an app mounted at /ui (the dashboard, corral/ui): given the configuration, the store,
# the engine's wake and the clock. The API does not import the dashboard: corral/main.py hands
# it over.
UiMount = Callable[[Config, Store, Wake, Callable[[], float]], Any]


def create_app(
    config: Config,
    store: Store,
    *,
    wake: Wake | None = None,
    own_store: bool = False,
    clock: Callable[[], float] = time.time,
    ui: UiMount | None = None,
) -> FastAPI:
    """The API over `store` (opened and closed with the app when `own_store`; an engine passes
    its own, open store). `wake` tells the engine to look now (default: its control socket);
    `ui` builds the dashboard mounted at /ui."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if own_store:
            await store.open()
        try:
            async with endpoint.running():  # the MCP transport's task group
                yield
        finally:
            if own_store:
                await store.close()

    app = FastAPI(
        title="Corral",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        responses=problems.documented(),
        description="Jobs, governance and the engine's mechanism over HTTP "
        "(docs/reference/http-api.md).",
    )
    rate = config.api.rate_limit
    kept = KeptSubmissions()
    tell = wake or waker(config.data_dir)

    def waking(op: str) -> object | None:
        """The engine's wake, heard by the kept submission service first (a kill switch made
        here reaches the next submission; an engine serving the app tells it of the CLI's)."""
        kept.heard(op)
        return tell(op)

    app.state.corral = ApiState(
        store=store,
        config=config,
        wake=waking,
        buckets=Buckets(rate.per_s, rate.burst),
        clock=clock,
        submissions=kept,
    )
    problems.install(app)
    app.add_middleware(problems.BodyLimit, limit=MAX_BODY_BYTES)
    endpoint = mcp.McpEndpoint(app.state.corral)
    app.router.routes.append(Route(mcp.PATH, endpoint))  # an ASGI app: every method goes to it
    app.include_router(jobs.router)
    app.include_router(dlq.router)
    app.include_router(governance.router)
    app.include_router(records.router)
    app.include_router(policy.router)
    app.include_router(mechanism.router)
    app.include_router(mechanism.metrics_router)
    app.include_router(intents.router)
    app.include_router(tokens.router)
    app.include_router(world.router)
    app.include_router(epics.router)
    app.include_router(knowledge.router)
    _health_routes(app, store, config)
    app.add_api_route("/docs", _docs_page, include_in_schema=False, response_class=HTMLResponse)
    if ui is not None:
        app.mount("/ui", ui(config, store, app.state.corral.wake, clock))
    return app


def _health_routes(app: FastAPI, store: Store, config: Config) -> None:
    @app.get("/healthz", tags=["health"], response_model=bodies.Health)
    async def healthz() -> Any:
        """The process is up (no token needed)."""
        return bodies.Health(status="ok").dump()

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=bodies.Health,
        responses={503: {"model": bodies.Health}},
    )
    async def readyz() -> Any:
        """The store answers and an engine serves the data directory (no token needed)."""
        try:
            await store.live_engines(since=0)
            store_ok = "ok"
        except Exception as err:  # any failure to read is "not ready", said in one word
            store_ok = f"unavailable: {type(err).__name__}"
        answer = await anyio.to_thread.run_sync(
            lambda: poke(config.data_dir, "wake", timeout=READY_TIMEOUT_S)
        )
        engine = "ok" if answer is not None else "not answering"
        ready = store_ok == "ok" and engine == "ok"
        body = bodies.Health(
            status="ready" if ready else "not ready", store=store_ok, engine=engine
        )
        return JSONResponse(body.dump(), status_code=200 if ready else 503)


_DOCS = """<!doctype html><html><head><meta charset="utf-8"><title>Corral API</title>
<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}code{background:#eee}
h3{margin-bottom:.2em}p{margin-top:.2em}</style></head><body><h1>Corral HTTP API</h1>
<p>The machine-readable description is <a href="/openapi.json">/openapi.json</a>; every route
but <code>/healthz</code> and <code>/readyz</code> wants <code>Authorization: Bearer
&lt;token&gt;</code>.</p><div id="ops">loading…</div><script>
fetch('/openapi.json').then(r => r.json()).then(spec => {
  const out = [];
  for (const [path, ops] of Object.entries(spec.paths)) for (const [m, op] of Object.entries(ops))
    out.push(`<h3><code>${m.toUpperCase()} ${path}</code></h3><p>${(op.description || op.summary
      || '').replace(/[<>&]/g, c => ({'<': '&lt;', '>': '&gt;', '&': '&amp;'}[c]))}</p>`);
  document.getElementById('ops').innerHTML = out.join('');
});
</script></body></html>"""


async def _docs_page(_: Request) -> HTMLResponse:
    """The operations of `/openapi.json`, rendered in the browser with no outside script."""
    return HTMLResponse(_DOCS)
