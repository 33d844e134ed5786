"""The dashboard's pages and forms, a FastAPI sub-application mounted at `/ui` beside the HTTP
API (same port, same tokens, same services). Pages are Jinja2 templates with autoescaping on;
the live parts are fragments htmx polls. Every POST needs a signed-in session, its CSRF token
and the scope the matching API route needs; a token sees its own tenant's jobs only."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI, Form, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.config import Config
from corral.core.ports import Store
from corral.domain.errors import CorralError, InvalidRequest, NotFound, NotPermitted
from corral.domain.governance import ApprovalState, ScopeKind
from corral.domain.states import JobState
from corral.domain.tokens import ApiToken
from corral.services import (
    Wake,
    approvals,
    audit,
    cancellation,
    clusters,
    controls,
    dashboard,
    dlq,
    engine,
    queries,
    runs,
    tenancy,
    tokens,
    world,
)
from corral.services import logs as job_logs
from corral.services.submissions import SubmitRequest, submit

from . import epics as epic_pages
from . import knowledge as knowledge_pages
from . import render, topology
from .session import COOKIE, LOGIN_COOKIE, Session, Signer

HERE = Path(__file__).parent
RUNS_SHOWN = 50  # the runs page: the tenant's runs, a page at a time (as the jobs page)
LOG_TAIL = 64 * 1024  # bytes of output the job page shows (the end of the latest attempt's)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
STATUS = {
    "invalid_request": 422,
    "not_permitted": 403,
    "permit_refused": 403,
    "not_found": 404,
    "conflict": 409,
    "stale_state": 409,
    "backpressure": 429,
    "store_unavailable": 503,
    "engine_not_running": 503,
}


class SignedOut(CorralError):
    """No valid session (or its token was revoked or expired)."""

    code = "unauthenticated"


def status_of(err: CorralError) -> int:
    for cls in type(err).__mro__:
        code = vars(cls).get("code")
        if isinstance(code, str) and code in STATUS:
            return STATUS[code]
    return 401 if isinstance(err, SignedOut) else 500


@dataclasses.dataclass(frozen=True, slots=True)
class UiState:
    store: Store
    config: Config
    wake: Wake
    clock: Callable[[], float]
    signer: Signer
    templates: Environment
    secure: bool  # served over TLS: the cookie gets Secure


@dataclasses.dataclass(frozen=True, slots=True)
class Viewer:
    """Who is signed in: the token (re-read on every request) and the session's CSRF token."""

    token: ApiToken
    session: Session
    csrf: str

    def can(self, scope: str) -> bool:
        return self.token.allows(scope)

    @property
    def actor(self) -> str:
        return f"token:{self.token.id}"


def _st(request: Request) -> UiState:
    st: UiState = request.app.state.ui
    return st


async def _viewer(request: Request) -> Viewer:
    st = _st(request)
    session = st.signer.read(request.cookies.get(COOKIE), st.clock())
    if session is None:
        raise SignedOut("sign in with an API token")
    try:
        token = await st.store.token(session.token_id)
    except NotFound:
        raise SignedOut("the session's token is gone") from None
    if not token.live_at(st.clock()):
        raise SignedOut("the session's token was revoked or has expired")
    return Viewer(token, session, st.signer.csrf(session))


Signed = Annotated[Viewer, Depends(_viewer)]


def _needs(scope: str | None) -> Callable[..., Awaitable[Viewer]]:
    """A POST's guard: a session, its CSRF token in the form, and `scope` when one is named
    (403 otherwise)."""

    async def check(request: Request, viewer: Signed) -> Viewer:
        form = await request.form()
        presented = form.get("csrf")
        if not _st(request).signer.csrf_ok(
            viewer.session, presented if isinstance(presented, str) else None
        ):
            raise NotPermitted("the form's CSRF token is missing or wrong: reload the page")
        if scope is not None and not viewer.can(scope):
            raise NotPermitted(f"this token lacks the scope {scope!r}")
        return viewer

    return check


def _reads(scope: str) -> Callable[..., Awaitable[Viewer]]:
    """A page's guard: a session whose token carries `scope`."""

    async def check(viewer: Signed) -> Viewer:
        if not viewer.can(scope):
            raise NotPermitted(f"this page needs the scope {scope!r}")
        return viewer

    return check


JobsRead = Annotated[Viewer, Depends(_reads("jobs:read"))]
ApproveRead = Annotated[Viewer, Depends(_reads("approve"))]
GovernRead = Annotated[Viewer, Depends(_reads("govern"))]
AdminRead = Annotated[Viewer, Depends(_reads("admin"))]
JobsWrite = Annotated[Viewer, Depends(_needs("jobs:write"))]
Approve = Annotated[Viewer, Depends(_needs("approve"))]
Govern = Annotated[Viewer, Depends(_needs("govern"))]
Admin = Annotated[Viewer, Depends(_needs("admin"))]
AnyPost = Annotated[Viewer, Depends(_needs(None))]  # any signed-in token: signing out
Text = Annotated[str, Form(max_length=2000)]


def create_ui(
    config: Config,
    store: Store,
    *,
    wake: Wake,
    clock: Callable[[], float] = time.time,
    secure: bool = False,
    key: bytes | None = None,
) -> FastAPI:
    """The dashboard over `store` (open: the API's or the engine's)."""
    ui = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    templates = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    render.install(templates)
    ui.state.ui = UiState(store, config, wake, clock, Signer(key), templates, secure)
    ui.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @ui.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    @ui.exception_handler(CorralError)
    async def on_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, CorralError)
        if isinstance(err, SignedOut):
            if request.method == "GET":
                if request.headers.get("HX-Request"):  # a poll: send the whole page to login
                    return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
                return RedirectResponse("/ui/login", status_code=303)
            return _page(request, "error.html", None, status=401, message=str(err))
        return _page(request, "error.html", None, status=status_of(err), message=str(err))

    @ui.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, err: Exception) -> Response:
        assert isinstance(err, RequestValidationError)
        said = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'input'}: {e.get('msg', '')}"
            for e in err.errors()
        )
        return _page(request, "error.html", None, status=422, message=f"invalid input: {said}")

    @ui.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, err: Exception) -> Response:
        assert isinstance(err, StarletteHTTPException)
        return _page(request, "error.html", None, status=err.status_code, message=str(err.detail))

    _routes(ui)
    return ui


def _page(
    request: Request, name: str, viewer: Viewer | None, *, status: int = 200, **context: Any
) -> HTMLResponse:
    st = _st(request)
    html = st.templates.get_template(name).render(
        viewer=viewer, now=st.clock(), path=request.url.path, **context
    )
    return HTMLResponse(html, status_code=status)


def _back(to: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303)


def _routes(ui: FastAPI) -> None:
    def login_form(request: Request, *, status: int = 200, error: str = "") -> HTMLResponse:
        """The sign-in form with a fresh nonce in a cookie and its CSRF token in the form (a
        page on another site can neither read the one nor forge the other)."""
        st = _st(request)
        nonce, csrf = st.signer.login_nonce()
        response = _page(request, "login.html", None, status=status, error=error, csrf=csrf)
        response.set_cookie(
            LOGIN_COOKIE, nonce, httponly=True, samesite="strict", secure=st.secure, path="/ui"
        )
        return response

    @ui.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request) -> HTMLResponse:
        return login_form(request)

    @ui.post("/login")
    async def login(
        request: Request,
        token: Annotated[str, Form(max_length=500)],
        csrf: Annotated[str, Form(max_length=200)] = "",
    ) -> Response:
        st = _st(request)
        if not st.signer.login_ok(request.cookies.get(LOGIN_COOKIE), csrf):
            return login_form(request, status=403, error="the sign-in form expired: sign in again")
        found = await tokens.authenticate(st.store, token, clock=st.clock)
        if found is None:
            return login_form(request, status=401, error="invalid, expired or revoked token")
        _, value = st.signer.new(found.id, st.clock())
        response = _back("/ui/")
        response.delete_cookie(LOGIN_COOKIE, path="/ui", httponly=True, samesite="strict")
        response.set_cookie(
            COOKIE,
            value,
            httponly=True,
            samesite="strict",
            secure=st.secure,
            path="/ui",
        )
        return response

    @ui.post("/logout")
    async def logout(request: Request, viewer: AnyPost) -> Response:
        response = _back("/ui/login")
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    _overview_routes(ui)
    _job_routes(ui)
    _governance_routes(ui)
    _mechanism_routes(ui)
    epic_pages.routes(ui, _page, _reads("jobs:read"), lambda request: _st(request).store)
    knowledge_pages.routes(ui, _page, _reads("jobs:read"), lambda request: _st(request).store)


# ---- overview ---------------------------------------------------------------------------------


def _overview_routes(ui: FastAPI) -> None:
    async def data(request: Request, viewer: Viewer) -> dict[str, Any]:
        st = _st(request)
        ov = await dashboard.overview(st.store, st.config, viewer.token, clock=st.clock)
        return {"ov": ov, "states": [s.value for s in JobState]}

    @ui.get("/", response_class=HTMLResponse)
    async def overview(request: Request, viewer: Signed) -> HTMLResponse:
        return _page(request, "overview.html", viewer, **await data(request, viewer))

    @ui.get("/fragments/overview", response_class=HTMLResponse)
    async def overview_live(request: Request, viewer: Signed) -> HTMLResponse:
        return _page(request, "overview_live.html", viewer, **await data(request, viewer))


# ---- jobs -------------------------------------------------------------------------------------


def _filter(
    state: str, role: str, environment: str, tenant: str, q: str, cursor: str
) -> dashboard.JobFilter:
    try:
        wanted = JobState(state) if state else None
    except ValueError:
        raise InvalidRequest(f"unknown state {state!r}") from None
    return dashboard.JobFilter(
        state=wanted,
        role=role.strip(),
        environment=environment.strip(),
        tenant=tenant.strip(),
        text=q.strip(),
        cursor=cursor.strip(),
    )


Param = Annotated[str, Query(max_length=200)]


def _job_routes(ui: FastAPI) -> None:
    async def page_of(request: Request, viewer: Viewer, f: dashboard.JobFilter) -> dict[str, Any]:
        st = _st(request)
        found = await dashboard.job_page(st.store, viewer.token, f)
        query = {
            k: v
            for k, v in {
                "state": f.state.value if f.state else "",
                "role": f.role,
                "environment": f.environment,
                "tenant": f.tenant,
                "q": f.text,
                "cursor": f.cursor,
            }.items()
            if v
        }
        return {"page": found, "f": f, "query": query, "states": [s.value for s in JobState]}

    def jobs_page(template: str) -> Callable[..., Awaitable[HTMLResponse]]:
        """The jobs table, whole (`jobs.html`) or its live rows only (`jobs_rows.html`)."""

        async def render(
            request: Request,
            viewer: JobsRead,
            state: Param = "",
            role: Param = "",
            environment: Param = "",
            tenant: Param = "",
            q: Param = "",
            cursor: Param = "",
        ) -> HTMLResponse:
            f = _filter(state, role, environment, tenant, q, cursor)
            return _page(request, template, viewer, **await page_of(request, viewer, f))

        return render

    ui.get("/jobs", response_class=HTMLResponse)(jobs_page("jobs.html"))
    ui.get("/fragments/jobs", response_class=HTMLResponse)(jobs_page("jobs_rows.html"))

    async def detail(request: Request, viewer: Viewer, job_id: str) -> dict[str, Any]:
        st = _st(request)
        job = await tenancy.job_of(st.store, job_id, viewer.token.tenant)
        d = await queries.job_detail(st.store, job.id)
        t = await queries.trace(st.store, job.id)
        r = await queries.report(st.store, job.id)
        out = await _tail(st, d.job, "stdout")
        err = await _tail(st, d.job, "stderr")
        return {
            "d": d,
            "job": d.job,
            "trace": t,
            "report": r,
            "stdout": out,
            "stderr": err,
            "checkpoints": await st.store.checkpoints(job.id),
            "runs": await runs.training_runs(st.store, d.job),
        }

    @ui.get("/jobs/{job_id}", response_class=HTMLResponse)
    async def job(request: Request, viewer: JobsRead, job_id: str) -> HTMLResponse:
        return _page(request, "job.html", viewer, **await detail(request, viewer, job_id))

    @ui.get("/fragments/jobs/{job_id}", response_class=HTMLResponse)
    async def job_live(request: Request, viewer: JobsRead, job_id: str) -> HTMLResponse:
        return _page(request, "job_live.html", viewer, **await detail(request, viewer, job_id))

    @ui.post("/jobs/{job_id}/cancel")
    async def cancel(
        request: Request, viewer: JobsWrite, job_id: str, reason: Text = ""
    ) -> Response:
        st = _st(request)
        await tenancy.job_of(st.store, job_id, viewer.token.tenant)
        why = f"{reason.strip() or 'cancelled from the dashboard'} (by {viewer.actor})"
        await cancellation.cancel(
            st.store, st.config, job_id, reason=why, caller=None, wake=st.wake
        )
        return _back(f"/ui/jobs/{job_id}")

    @ui.post("/jobs/{job_id}/resume")
    async def resume(request: Request, viewer: JobsWrite, job_id: str, prompt: Text) -> Response:
        st = _st(request)
        job = await tenancy.job_of(st.store, job_id, viewer.token.tenant)
        if not prompt.strip():
            raise InvalidRequest("say what the agent should do next")
        asked = SubmitRequest(
            prompt=prompt,
            role=job.role,
            env_name=job.env_name,
            tenant=job.tenant,
            resume_from=job.id,
            by=viewer.actor,
        )
        done = await submit(st.store, st.config, asked, st.wake)
        return _back(f"/ui/jobs/{done.result.job.id}")

    @ui.post("/jobs/{job_id}/requeue")
    async def requeue(request: Request, viewer: JobsWrite, job_id: str) -> Response:
        st = _st(request)
        await tenancy.job_of(st.store, job_id, viewer.token.tenant)
        fresh = await dlq.requeue(st.store, st.config, job_id, wake=st.wake)
        return _back(f"/ui/jobs/{fresh.id}")


async def _tail(st: UiState, job: Any, stream: job_logs.Stream) -> str:
    """The end of the latest attempt's output (at most LOG_TAIL bytes)."""
    c = await job_logs.tail(st.store, job, stream=stream, limit=LOG_TAIL)
    return c.data.decode(errors="replace")


# ---- approvals and governance -----------------------------------------------------------------


def _governance_routes(ui: FastAPI) -> None:  # noqa: C901 - the governance forms
    @ui.get("/approvals", response_class=HTMLResponse)
    async def approvals_page(request: Request, viewer: ApproveRead) -> HTMLResponse:
        st = _st(request)
        found = await tenancy.approvals_of(st.store, viewer.token.tenant, state=None)
        found.sort(key=lambda a: (a.state is not ApprovalState.PENDING, -a.requested_at))
        jobs = {a.job_id: await st.store.get_job(a.job_id) for a in found}
        return _page(request, "approvals.html", viewer, approvals=found[:200], jobs=jobs)

    async def decide(
        request: Request, viewer: Viewer, approval_id: str, ok: bool, note: str
    ) -> Response:
        st = _st(request)
        await tenancy.approval_of(st.store, approval_id, viewer.token.tenant)
        await approvals.decide(
            st.store, st.config, approval_id, approve=ok, by=viewer.actor, wake=st.wake, note=note
        )
        return _back("/ui/approvals")

    @ui.post("/approvals/{approval_id}/approve")
    async def approve(
        request: Request, viewer: Approve, approval_id: str, note: Text = ""
    ) -> Response:
        return await decide(request, viewer, approval_id, True, note)

    @ui.post("/approvals/{approval_id}/deny")
    async def deny(
        request: Request, viewer: Approve, approval_id: str, note: Text = ""
    ) -> Response:
        return await decide(request, viewer, approval_id, False, note)

    @ui.get("/governance", response_class=HTMLResponse)
    async def governance(
        request: Request, viewer: GovernRead, stage: Param = "", verdict: Param = ""
    ) -> HTMLResponse:
        st = _st(request)
        admin = viewer.can("admin")
        switches = await tenancy.visible_controls(
            st.store,
            await controls.kill_switches(st.store, st.clock),
            viewer.token.tenant,
            admin=admin,
        )
        pauses = await tenancy.visible_controls(
            st.store, await st.store.pauses(active_only=True), viewer.token.tenant, admin=admin
        )
        budgets = (
            await controls.budgets(st.store, scope=None, target=None, clock=st.clock)
            if admin
            else []
        )
        launches = await controls.dark_launches(st.store) if admin else []
        f = queries.policy_filter(stage=stage or None, verdict=verdict or None, limit=50)
        log = await queries.policy_log(st.store, f, tenant=viewer.token.tenant)
        return _page(
            request,
            "governance.html",
            viewer,
            switches=switches,
            pauses=pauses,
            budgets=budgets,
            launches=launches,
            policy=list(reversed(log)),
            scopes=[s.value for s in ScopeKind],
            stage=stage,
            verdict=verdict,
            verdicts=queries.VERDICTS,
        )

    async def target_for(
        request: Request, viewer: Viewer, scope: str, target: str
    ) -> tuple[ScopeKind, str | None]:
        st = _st(request)
        kind = controls.choice(ScopeKind, scope, "scope")
        chosen: str | None = target.strip() or None
        if kind is ScopeKind.TENANT and chosen is None:
            chosen = viewer.token.tenant
        await tenancy.scope_allowed(
            st.store, viewer.token.tenant, kind, chosen, admin=viewer.can("admin")
        )
        return kind, chosen

    @ui.post("/kill-switches")
    async def kill_on(
        request: Request, viewer: Govern, scope: Text, reason: Text, target: Text = ""
    ) -> Response:
        st = _st(request)
        kind, chosen = await target_for(request, viewer, scope, target)
        await controls.kill_switch_on(
            st.store,
            scope=kind,
            target=chosen,
            reason=reason,
            expires_in=None,
            by=viewer.actor,
            wake=st.wake,
        )
        return _back("/ui/governance")

    @ui.post("/kill-switches/{switch_id}/lift")
    async def kill_off(request: Request, viewer: Govern, switch_id: str) -> Response:
        st = _st(request)
        visible = await tenancy.visible_controls(
            st.store,
            await controls.kill_switches(st.store, st.clock),
            viewer.token.tenant,
            admin=viewer.can("admin"),
        )
        mine = [s for s in visible if s.id == switch_id]
        if not mine:
            raise NotFound(f"no active kill switch {switch_id}")
        await tenancy.scope_allowed(
            st.store, viewer.token.tenant, mine[0].scope, mine[0].target, admin=viewer.can("admin")
        )
        await controls.kill_switch_off(
            st.store,
            switch_id=switch_id,
            scope=mine[0].scope,
            target=mine[0].target,
            by=viewer.actor,
            wake=st.wake,
        )
        return _back("/ui/governance")

    @ui.post("/pauses")
    async def pause(
        request: Request, viewer: Govern, scope: Text, reason: Text, target: Text = ""
    ) -> Response:
        st = _st(request)
        kind, chosen = await target_for(request, viewer, scope, target)
        await controls.pause(
            st.store, scope=kind, target=chosen, reason=reason, by=viewer.actor, wake=st.wake
        )
        return _back("/ui/governance")

    @ui.post("/pauses/resume")
    async def resume(request: Request, viewer: Govern, scope: Text, target: Text = "") -> Response:
        st = _st(request)
        kind, chosen = await target_for(request, viewer, scope, target)
        await controls.resume(st.store, scope=kind, target=chosen, by=viewer.actor, wake=st.wake)
        return _back("/ui/governance")

    @ui.post("/audit/verify", response_class=HTMLResponse)
    async def audit_verify(request: Request, viewer: Admin) -> HTMLResponse:
        st = _st(request)
        report = await audit.verify(st.store, st.config)
        return _page(request, "audit.html", viewer, report=report)


# ---- mechanism, environments, runs ------------------------------------------------------------


def _mechanism_routes(ui: FastAPI) -> None:
    @ui.get("/mechanism", response_class=HTMLResponse)
    async def mechanism(request: Request, viewer: AdminRead) -> HTMLResponse:
        st = _st(request)
        snap, err = await dashboard.engine_snapshot(st.config.data_dir)
        dead = await tenancy.jobs_of(st.store, viewer.token.tenant, limit=100, dead_lettered=True)
        history = await queries.core_events(st.store, kind=None, limit=50)
        return _page(
            request,
            "mechanism.html",
            viewer,
            snap=snap,
            engine_error=err,
            workspaces=await queries.workspaces(st.store),
            dlq=dead.jobs,
            history=history,
        )

    @ui.post("/breakers/{name}/reset")
    async def reset(request: Request, viewer: Admin, name: str) -> Response:
        data_dir = _st(request).config.data_dir
        await anyio.to_thread.run_sync(lambda: engine.reset_breaker(data_dir, name))
        return _back("/ui/mechanism")

    @ui.post("/escalations/{escalation_id}/clear")
    async def clear(request: Request, viewer: Admin, escalation_id: str) -> Response:
        data_dir = _st(request).config.data_dir
        await anyio.to_thread.run_sync(lambda: engine.clear_escalation(data_dir, escalation_id))
        return _back("/ui/mechanism")

    @ui.get("/environments", response_class=HTMLResponse)
    async def environments(
        request: Request, viewer: Annotated[Viewer, Depends(_reads("metrics"))]
    ) -> HTMLResponse:
        st = _st(request)
        envs = await dashboard.environments(st.store, st.config)
        # each Ray environment's cluster asked now, off the event loop (each probe is bounded)
        health = await anyio.to_thread.run_sync(lambda: clusters.clusters(st.config))
        return _page(
            request, "environments.html", viewer, envs=envs, health={h.env: h for h in health}
        )

    @ui.get("/topology", response_class=HTMLResponse)
    async def topology_page(request: Request, viewer: JobsRead) -> HTMLResponse:
        """The execution topology of the token's tenant as inline SVG (ui/topology.py)."""
        st = _st(request)
        snap = await world.snapshot(
            st.store, st.config.settings, world.Scope(tenant=viewer.token.tenant), clock=st.clock
        )
        return _page(
            request,
            "topology.html",
            viewer,
            drawing=topology.layout(snap),
            deadlocks=len(snap.deadlocks),
            box_w=topology.BOX_W,
            box_h=topology.BOX_H,
        )

    @ui.get("/runs", response_class=HTMLResponse)
    async def runs(request: Request, viewer: JobsRead, before: Param = "") -> HTMLResponse:
        st = _st(request)
        found = await queries.runs(
            st.store,
            limit=RUNS_SHOWN + 1,  # one more: is there an older page
            state=None,
            tenant=viewer.token.tenant,
            before=before or None,
        )
        shown = found.runs[:RUNS_SHOWN]
        older = shown[-1].job_id if len(found.runs) > RUNS_SHOWN else None
        return _page(request, "runs.html", viewer, runs=shown, older=older)
