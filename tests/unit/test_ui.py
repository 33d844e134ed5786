"""The dashboard in process (httpx ASGITransport over create_app with the dashboard mounted, the
in-memory store): sign-in and sign-out, the session cookie's flags, CSRF, a read-only token's
forged POST, tenant isolation, escaping of everything an agent wrote, and the CSP header."""

from __future__ import annotations

import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from corral import ui
from corral.api import create_app
from corral.config import Config
from corral.domain.agents import AgentEvent, PolicyEvaluation, ToolCallTrace
from corral.domain.states import JobState
from corral.domain.tokens import split_token
from corral.services import tokens
from corral.store.memory import MemoryStore
from tests.contract.test_store_contract import NOW, claim, ending
from tests.unit.test_api_jobs import CONFIG, TOKENS, config

GATED = CONFIG.replace("roles:\n", "roles:\n  gated: {requires_approval: true}\n")
PLANT = '<script>alert("x")</script><img src=x onerror="alert(1)"><b id="planted">bold</b>'
UI_TOKENS = {**TOKENS, "governor": ("acme", "jobs:read,govern"), "outsider": ("globex", "admin")}


@dataclass
class Ui:
    client: httpx.AsyncClient
    store: MemoryStore
    tok: dict[str, str]

    async def api(self, method: str, url: str, who: str = "admin", **kw: Any) -> Any:
        r = await self.client.request(
            method, url, headers={"Authorization": f"Bearer {self.tok[who]}"}, **kw
        )
        assert r.status_code < 300, r.text
        return r.json()

    async def submit(self, who: str = "admin", **body: Any) -> str:
        made = await self.api("POST", "/api/v1/jobs", who, json={"command": ["true"], **body})
        job_id: str = made["job"]["id"]
        return job_id

    async def login(self, who: str) -> httpx.Response:
        self.client.cookies.clear()
        form = await self.client.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        nonce = re.search(r"corral_login=([^;]+)", form.headers["set-cookie"])
        assert csrf and nonce, form.text
        # httpx keeps a Secure cookie for https only: hand it back as the browser would
        self.client.cookies.set("corral_login", nonce.group(1))
        r = await self.client.post(
            "/ui/login", data={"token": self.tok[who], "csrf": csrf.group(1)}
        )
        assert r.status_code == 303, r.text
        return r

    async def csrf(self, page: str = "/ui/") -> str:
        r = await self.client.get(page)
        assert r.status_code == 200, r.text
        found = re.search(r'name="csrf" value="([^"]+)"', r.text)
        assert found, "no CSRF field on the page"
        return found.group(1)


def with_ui(cfg: Config, body: Callable[[Ui], Awaitable[None]], *, secure: bool = False) -> None:
    async def main() -> None:
        store = MemoryStore()
        made = {
            who: (await tokens.create(store, tenant=t, scopes=s, by="test")).text
            for who, (t, s) in UI_TOKENS.items()
        }

        def mount(c: Config, s: Any, w: Any, clock: Any) -> Any:
            return ui.mount(c, s, w, clock, secure=secure)

        app = create_app(cfg, store, wake=lambda op: None, ui=mount)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await body(Ui(client, store, made))

    anyio.run(main)


class Elements(HTMLParser):
    """Every element the browser would build from a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Elements()
    p.feed(html)
    return p.tags


def test_sign_in_sets_a_strict_httponly_cookie_and_sign_out_ends_it(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        first = await u.client.get("/ui/")
        assert first.status_code == 303 and first.headers["location"] == "/ui/login"
        poll = await u.client.get("/ui/fragments/overview", headers={"HX-Request": "true"})
        assert poll.status_code == 401 and poll.headers["hx-redirect"] == "/ui/login"
        form = await u.csrf("/ui/login")
        bad = await u.client.post("/ui/login", data={"token": "crl_nope", "csrf": form})
        assert bad.status_code == 401 and "invalid, expired or revoked token" in bad.text
        # a sign-in posted from elsewhere (no form token, or one bound to another browser's
        # nonce) is refused before the token is even looked at: no login CSRF
        right = {"token": u.tok["reader"]}
        forged = await u.client.post("/ui/login", data=right)
        assert forged.status_code == 403 and "corral_session" not in forged.headers.get(
            "set-cookie", ""
        )
        other = await u.csrf("/ui/login")  # a fresh form: the nonce cookie is replaced
        stale = await u.client.post("/ui/login", data={**right, "csrf": form})
        assert stale.status_code == 403 and other != form
        r = await u.login("reader")
        (cookie,) = [c for c in r.headers.get_list("set-cookie") if c.startswith("corral_session=")]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie  # plain HTTP on loopback
        assert u.tok["reader"] not in cookie  # the token's text never goes into the cookie
        page = await u.client.get("/ui/")
        assert page.status_code == 200 and "Fleet overview" in page.text
        out = await u.client.post("/ui/logout", data={"csrf": await u.csrf()})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert (await u.client.get("/ui/")).status_code == 303
        # a cookie forged or altered is no session
        u.client.cookies.set("corral_session", cookie.split(";")[0].split("=", 1)[1] + "x")
        assert (await u.client.get("/ui/jobs")).status_code == 303

    with_ui(config(tmp_path), body)


def test_the_cookie_is_secure_over_tls_and_a_revoked_token_ends_its_session(
    tmp_path: Path,
) -> None:
    async def body(u: Ui) -> None:
        r = await u.login("reader")
        assert "Secure" in r.headers["set-cookie"]
        # httpx keeps Secure cookies for https only: hand it back as the browser would
        session = [c for c in r.headers.get_list("set-cookie") if c.startswith("corral_session=")]
        assert len(session) == 1 and "Secure" in session[0]
        u.client.cookies.set("corral_session", session[0].split(";")[0].split("=", 1)[1])
        assert (await u.client.get("/ui/")).status_code == 200
        parts = split_token(u.tok["reader"])
        assert parts is not None
        await tokens.revoke(u.store, parts[0], by="test")
        assert (await u.client.get("/ui/")).status_code == 303

    with_ui(config(tmp_path), body, secure=True)


def test_every_form_needs_its_csrf_token(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        job = await u.submit(role="gated")
        await u.login("admin")
        url = f"/ui/jobs/{job}/cancel"
        for data in ({}, {"csrf": "forged"}, {"csrf": ""}):
            r = await u.client.post(url, data=data)
            assert r.status_code == 403 and "CSRF" in r.text, r.text
        assert (await u.store.get_job(job)).state is JobState.AWAITING_APPROVAL
        # another session's CSRF token is not this one's
        other = await u.csrf(f"/ui/jobs/{job}")
        await u.login("admin")
        assert (await u.client.post(url, data={"csrf": other})).status_code == 403
        r = await u.client.post(url, data={"csrf": await u.csrf(f"/ui/jobs/{job}"), "reason": "x"})
        assert r.status_code == 303, r.text
        cancelled = await u.store.get_job(job)
        assert cancelled.state is JobState.CANCELLED
        assert "(by token:" in (cancelled.cancel_requested or "")

    with_ui(config(tmp_path, GATED), body)


def test_a_read_only_token_sees_no_action_and_a_forged_post_is_403(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        job = await u.submit(role="gated")
        await u.login("reader")
        page = await u.client.get(f"/ui/jobs/{job}")
        assert page.status_code == 200
        forms = [a.get("action") for t, a in elements(page.text) if t == "form"]
        assert forms == ["/ui/logout"], forms  # signing out is the only form
        assert "Cancel job" not in page.text
        for path in ("/ui/approvals", "/ui/governance", "/ui/mechanism"):
            assert (await u.client.get(path)).status_code == 403
        csrf = await u.csrf(f"/ui/jobs/{job}")
        forged = {
            f"/ui/jobs/{job}/cancel": {},
            "/ui/kill-switches": {"scope": "tenant", "reason": "no"},
            "/ui/pauses": {"scope": "tenant", "reason": "no"},
            "/ui/breakers/x/reset": {},
        }
        for url, data in forged.items():
            r = await u.client.post(url, data={"csrf": csrf, **data})
            assert r.status_code == 403, (url, r.text)
        assert (await u.store.get_job(job)).state is JobState.AWAITING_APPROVAL
        assert await u.store.kill_switches() == [] and await u.store.pauses() == []

    with_ui(config(tmp_path, GATED), body)


def test_a_token_sees_and_touches_its_own_tenants_jobs_only(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        mine = await u.submit(who="writer", role="gated", command=["echo", "acme-job"])
        theirs = await u.submit(who="other", role="gated", command=["echo", "globex-job"])
        await u.login("outsider")  # admin of globex: still not acme's jobs in the UI
        await u.login("writer")
        listed = await u.client.get("/ui/jobs")
        assert mine in listed.text and theirs not in listed.text
        assert (await u.client.get(f"/ui/jobs/{theirs}")).status_code == 404
        assert (await u.client.get(f"/ui/jobs/{theirs[-8:]}")).status_code == 404
        csrf = await u.csrf()
        r = await u.client.post(f"/ui/jobs/{theirs}/cancel", data={"csrf": csrf})
        assert r.status_code == 404
        assert (await u.store.get_job(theirs)).state is JobState.AWAITING_APPROVAL
        # a non-admin cannot widen the jobs table to another tenant
        assert (await u.client.get("/ui/jobs?tenant=globex")).status_code == 403
        await u.login("other")
        fleet = await u.client.get("/ui/fragments/overview")
        assert "tenant globex" in fleet.text and "acme" not in fleet.text

    with_ui(config(tmp_path, GATED), body)


async def _planted(u: Ui) -> str:
    """A job whose prompt, command, output, tool input and final text are all planted HTML."""
    job = await u.submit(command=["echo", PLANT], prompt=PLANT, role="gated")
    j = await u.store.get_job(job)
    await u.store.release_approved(job, now=NOW, aging_s=60)
    [c] = await u.store.start_attempts([claim(await u.store.get_job(job))], now=NOW)
    Path(c.attempt.dir).mkdir(parents=True, exist_ok=True)
    (Path(c.attempt.dir) / "stdout.log").write_text(PLANT + "\nlast line\n")
    await u.store.finish([ending(c.attempt, JobState.SUCCEEDED)], now=NOW + 3)
    await u.store.append_policy_evaluations(
        [
            PolicyEvaluation(
                at=NOW + 1,
                job_id=job,
                attempt=1,
                stage="tool_call",
                subject=PLANT,
                verdict="deny",
                reason="out_of_scope",
                message=PLANT,
            )
        ]
    )
    await u.store.record_agent_event(
        AgentEvent(
            event_id="e1",
            job_id=job,
            attempt=1,
            at=NOW + 2,
            role=j.role,
            worker=j.worker,
            tenant=j.tenant,
            tool_calls=(
                ToolCallTrace(
                    tool="Bash", input={"command": PLANT}, output=PLANT, denied=True, reason=PLANT
                ),
            ),
            tokens_in=12,
            tokens_out=34,
            cost_usd=0.25,
            final_text=PLANT,
        )
    )
    return job


def test_everything_an_agent_wrote_is_escaped(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        job = await _planted(u)
        await u.login("admin")
        for path in (f"/ui/jobs/{job}", "/ui/jobs", f"/ui/fragments/jobs/{job}"):
            r = await u.client.get(path)
            assert r.status_code == 200, r.text
            tags = elements(r.text)
            scripts = [a.get("src") for t, a in tags if t == "script"]
            assert scripts in ([], ["/ui/static/htmx.min.js"]), scripts
            assert not [a for t, a in tags if t == "img" or a.get("id") == "planted"], path
            assert not [a for _, a in tags if any(k.startswith("on") for k in a)], path
            assert "&lt;script&gt;alert(" in r.text
        page = (await u.client.get(f"/ui/jobs/{job}")).text
        assert page.count("&lt;b id=&#34;planted&#34;&gt;") >= 6  # prompt, output, tool call…
        assert "last line" in page and "Bash" in page and "$0.2500" in page

    with_ui(config(tmp_path, GATED), body)


def test_every_page_carries_a_csp_without_inline_scripts(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        job = await u.submit()
        login = await u.client.get("/ui/login")
        await u.login("admin")
        pages = [login] + [
            await u.client.get(p)
            for p in (
                "/ui/",
                "/ui/fragments/overview",
                "/ui/jobs",
                f"/ui/jobs/{job}",
                "/ui/approvals",
                "/ui/governance",
                "/ui/mechanism",
                "/ui/environments",
                "/ui/runs",
                "/ui/topology",
            )
        ]
        for r in pages:
            assert r.status_code == 200, (r.url, r.text)
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
            assert "unsafe-eval" not in csp and "frame-ancestors 'none'" in csp
            inline = [a for t, a in elements(r.text) if t == "script" and not a.get("src")]
            assert inline == [], r.url
        js = await u.client.get("/ui/static/htmx.min.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert js.text.startswith("var htmx=")

    with_ui(config(tmp_path), body)


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_approvals_page_decides_with_a_comment_attributed_to_the_token(
    tmp_path: Path, decision: str
) -> None:
    async def body(u: Ui) -> None:
        job = await u.submit(who="writer", role="gated", prompt="deploy <prod>")
        await u.login("approver")
        page = await u.client.get("/ui/approvals")
        assert "deploy &lt;prod&gt;" in page.text and "Approve" in page.text
        [approval] = await u.store.approvals(job_id=job)
        r = await u.client.post(
            f"/ui/approvals/{approval.id}/{decision}",
            data={"csrf": await u.csrf("/ui/approvals"), "note": "looked at it"},
        )
        assert r.status_code == 303, r.text
        [decided] = await u.store.approvals(job_id=job)
        assert decided.note == "looked at it" and (decided.decided_by or "").startswith("token:")
        want = JobState.QUEUED if decision == "approve" else JobState.DENIED
        assert (await u.store.get_job(job)).state is want
        overview = await u.client.get("/ui/fragments/overview")
        assert "Nothing waits for you." in overview.text
        out = await u.client.post("/ui/logout", data={"csrf": await u.csrf("/ui/approvals")})
        assert out.status_code == 303  # a token without jobs:read signs out too

    with_ui(config(tmp_path, GATED), body)


def test_kill_switch_engaged_and_lifted_from_the_governance_page(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        await u.login("governor")
        csrf = await u.csrf("/ui/governance")
        r = await u.client.post(
            "/ui/kill-switches", data={"csrf": csrf, "scope": "tenant", "reason": "runaway <x>"}
        )
        assert r.status_code == 303, r.text
        [switch] = await u.store.kill_switches()
        assert (switch.target, switch.reason) == ("acme", "runaway <x>")
        assert switch.created_by.startswith("token:")
        page = await u.client.get("/ui/fragments/overview")
        assert "runaway &lt;x&gt;" in page.text
        # beyond the tenant needs admin
        r = await u.client.post(
            "/ui/kill-switches", data={"csrf": csrf, "scope": "global", "reason": "all"}
        )
        assert r.status_code == 403
        r = await u.client.post(f"/ui/kill-switches/{switch.id}/lift", data={"csrf": csrf})
        assert r.status_code == 303
        assert [s for s in await u.store.kill_switches() if s.lifted_at is None] == []

    with_ui(config(tmp_path), body)


def test_jobs_table_filters_searches_and_pages_newest_first(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        made = [await u.submit(command=["echo", f"n{i}"], role="gated") for i in range(5)]
        await u.submit(command=["echo", "needle"])
        await u.login("admin")
        found = await u.client.get("/ui/jobs?q=NEEDLE")
        assert found.text.count('data-job="') == 1
        waiting = await u.client.get("/ui/jobs?state=AWAITING_APPROVAL")
        ids = re.findall(r'data-job="([^"]+)"', waiting.text)
        assert ids == list(reversed(made))
        r = await u.client.get(f"/ui/fragments/jobs?state=AWAITING_APPROVAL&cursor={made[2]}")
        assert re.findall(r'data-job="([^"]+)"', r.text) == [made[1], made[0]]
        assert (await u.client.get("/ui/jobs?state=NOPE")).status_code == 422

    with_ui(config(tmp_path, GATED), body)


def test_the_policy_log_filters_by_verdict_and_stage(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        job = await _planted(u)
        await u.login("admin")
        denied = await u.client.get("/ui/governance?verdict=deny&stage=tool_call")
        assert denied.status_code == 200 and "out_of_scope" in denied.text
        assert f'href="/ui/jobs/{job}"' in denied.text
        allowed = await u.client.get("/ui/governance?verdict=allow")
        assert "out_of_scope" not in allowed.text
        bad = await u.client.get("/ui/governance?verdict=maybe")
        assert bad.status_code == 422 and "--verdict must be one of" in bad.text

    with_ui(config(tmp_path, GATED), body)


def test_the_overview_counts_waiting_and_running_jobs_against_their_caps(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        running = await u.submit()
        await u.submit()
        await u.store.start_attempts([claim(await u.store.get_job(running))], now=NOW)
        await u.login("admin")
        page = await u.client.get("/ui/fragments/overview")
        rows = re.findall(
            r"<tr><td>(\w+)</td><td class=\"num\">(\d+)[^<]*</td><td class=\"num[^\"]*\">(\d+)"
            r"</td><td class=\"num\">(\d+|–)</td></tr>",
            page.text,
        )
        assert ("small", "1", "1", "4") in rows, rows  # the role: waiting, running, cap
        assert ("local", "1", "1", "4") in rows, rows  # the environment

    with_ui(config(tmp_path), body)


def test_bad_input_and_unknown_pages_are_html_pages_not_tracebacks(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        await u.login("governor")
        csrf = await u.csrf("/ui/governance")
        r = await u.client.post("/ui/kill-switches", data={"csrf": csrf, "scope": "tenant"})
        assert r.status_code == 422 and "invalid input: reason: Field required" in r.text
        r = await u.client.post(
            "/ui/kill-switches", data={"csrf": csrf, "scope": "galaxy", "reason": "x"}
        )
        assert r.status_code == 422 and "galaxy" in r.text
        missing = await u.client.get("/ui/nothing-here")
        assert missing.status_code == 404 and "text/html" in missing.headers["content-type"]
        assert "Traceback" not in missing.text and "Not Found" in missing.text
        assert await u.store.kill_switches() == []

    with_ui(config(tmp_path), body)


AGENT = CONFIG.replace(
    "roles:\n", "workers:\n  coder: {adapter: claude-code}\nroles:\n  agent: {worker: coder}\n"
)


def test_an_ended_agent_job_is_resumed_from_its_page(tmp_path: Path) -> None:
    async def body(u: Ui) -> None:
        job = await u.submit(command=[], prompt="write the parser", role="agent")
        [c] = await u.store.start_attempts([claim(await u.store.get_job(job))], now=NOW)
        await u.store.finish([ending(c.attempt, JobState.SUCCEEDED)], now=NOW + 3)
        await u.login("writer")
        page = await u.client.get(f"/ui/jobs/{job}")
        assert "Resume session" in page.text
        csrf = await u.csrf(f"/ui/jobs/{job}")
        url = f"/ui/jobs/{job}/resume"
        assert (await u.client.post(url, data={"csrf": csrf, "prompt": " "})).status_code == 422
        r = await u.client.post(url, data={"csrf": csrf, "prompt": "now the tests"})
        assert r.status_code == 303, r.text
        fresh = await u.store.get_job(r.headers["location"].rsplit("/", 1)[1])
        assert fresh.id != job and fresh.prompt == "now the tests"
        assert fresh.options.resume_from == job and fresh.tenant == "acme"
        await u.login("reader")
        assert "Resume session" not in (await u.client.get(f"/ui/jobs/{job}")).text
        await u.login("admin")
        command_job = await u.submit()
        assert "Resume session" not in (await u.client.get(f"/ui/jobs/{command_job}")).text

    with_ui(config(tmp_path, AGENT), body)


def test_the_environments_page_shows_each_ray_clusters_health(tmp_path: Path) -> None:
    """A Ray environment's cluster is asked as the page renders: one that does not answer is
    said to be unreachable, with why; a local environment has no cluster."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"  # nothing listens once it closes
    ray = CONFIG + f"environments:\n  gpu: {{kind: ray, address: '{dead}', max_inflight: 2}}\n"

    async def body(u: Ui) -> None:
        await u.login("admin")
        r = await u.client.get("/ui/environments")
        assert r.status_code == 200, r.text
        rows = {row[0]: row for row in table_rows(r.text)}
        assert rows["gpu"][-1].startswith("unreachable")
        assert rows["local"][-1] == "–"

    with_ui(config(tmp_path, ray), body)


def table_rows(html: str) -> list[list[str]]:
    """The text of each cell of each row with cells (`td`) of a page's tables."""

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[list[str]] = []
            self.cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: Any) -> None:
            if tag == "tr":
                self.rows.append([])
            elif tag == "td":
                self.cell = []

        def handle_endtag(self, tag: str) -> None:
            if tag == "td" and self.cell is not None:
                self.rows[-1].append(" ".join("".join(self.cell).split()))
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.cell is not None:
                self.cell.append(data)

    parser = Rows()
    parser.feed(html)
    return [r for r in parser.rows if r]


def test_the_runs_page_shows_the_tenants_runs_a_page_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.ui import app as ui_app

    monkeypatch.setattr(ui_app, "RUNS_SHOWN", 2)

    async def body(u: Ui) -> None:
        mine = [
            await u.submit(who="writer", role="gated", command=["echo", f"m{i}"]) for i in range(3)
        ]
        theirs = await u.submit(who="other", role="gated", command=["echo", "globex"])
        await u.login("writer")
        first = await u.client.get("/ui/runs")
        shown = re.findall(r'href="/ui/jobs/([^"]+)"', first.text)
        assert shown == [mine[2], mine[1]] and theirs not in first.text
        older = re.search(r'href="/ui/runs\?before=([^"]+)"', first.text)
        assert older and older.group(1) == mine[1]
        second = await u.client.get(f"/ui/runs?before={older.group(1)}")
        assert re.findall(r'href="/ui/jobs/([^"]+)"', second.text) == [mine[0]]
        assert "Older runs" not in second.text

    with_ui(config(tmp_path, GATED), body)
