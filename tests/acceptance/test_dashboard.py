"""The dashboard in a real browser (Debian's Chromium through Playwright, never a downloaded
one) against one live `corral serve` on loopback that runs real jobs: the overview and a job's
logs follow without a reload, an approval and a kill switch take effect, a breaker is reset and
a dead-lettered job requeued from the mechanism page, a read-only token gets no button and a
forged POST is refused, and planted HTML never becomes an element. Screenshots of the overview,
a job and the approvals go to the test's temporary directory."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import sync_playwright

from tests.acceptance.conftest import Corral, alive
from tests.helpers import eventually

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CONFIG = """\
scheduler: {poll_interval_s: 0.1}
core: {heartbeat_s: 0.5, heartbeat_timeout_s: 5}
breakers: {min_calls: 2, consecutive_failures: 2, open_s: 300}
environments:
  local: {max_inflight: 8}
workers:
  alpha: {adapter: command}
roles:
  default: {concurrency: 4, retry: {base_s: 0.05, cap_s: 0.2}}
  gated: {requires_approval: true}
  once: {limits: {max_attempts: 1}}
  crashy: {worker: alpha, limits: {max_attempts: 1}}
"""
PLANT = '<script>alert("x")</script><img src=x onerror="alert(1)"><b id="planted">b</b>'
WAIT_MS = 20_000
ERRORS: dict[int, list[str]] = {}  # a page's script errors, by id(page)


@dataclass
class Live:
    corral: Corral
    url: str
    admin: str
    viewer: str
    shots: Path

    def api(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        h = {"Authorization": f"Bearer {token or self.admin}"}
        r = httpx.request(method, self.url + path, headers=h, timeout=30, **kw)
        assert r.status_code < 300, r.text
        return r.json()

    def submit(self, *command: str, **body: Any) -> str:
        made = self.api("POST", "/api/v1/jobs", json={"command": list(command), **body})
        job_id: str = made["job"]["id"]
        return job_id

    def state(self, job_id: str) -> str:
        state: str = self.api("GET", f"/api/v1/jobs/{job_id}")["state"]
        return state


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup installs Debian's chromium")
    root = tmp_path_factory.mktemp("dashboard")
    c = Corral(root, CONFIG)
    make = ("token", "create", "--tenant", "acme", "--scopes")
    admin = c.ok(*make, "admin").strip()
    viewer = c.ok(*make, "jobs:read", "--name", "viewer").strip()
    try:
        c.serve("--http", "127.0.0.1:0")
        url = eventually(
            lambda: (
                (m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)", c.engine_log()))
                and m.group(1)
            ),
            timeout=30,
            what="the engine to say where it serves HTTP",
        )
        yield Live(c, url, admin, viewer, root / "screenshots")
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def browser(live: Live) -> Iterator[Any]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def signed_in(browser: Any, live: Live, token: str) -> Any:
    """A fresh page signed in with `token`, failing on any script error or dialog not asked."""
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.goto(live.url + "/ui/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(live.url + "/ui/")
    ERRORS[id(page)] = errors
    return page


@pytest.fixture(scope="module")
def admin_page(browser: Any, live: Live) -> Iterator[Any]:
    page = signed_in(browser, live, live.admin)
    page.on("dialog", lambda d: d.accept())  # the confirmations of the actions
    yield page
    page.context.close()


def mark(page: Any) -> None:
    """A flag on the window: still there later means the page was never reloaded."""
    page.evaluate("window.__corral_mark = 1")


def not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("window.__corral_mark === 1"))


def shot(page: Any, live: Live, name: str) -> None:
    live.shots.mkdir(exist_ok=True)
    page.screenshot(path=str(live.shots / f"{name}.png"))
    assert (live.shots / f"{name}.png").stat().st_size > 1000


def test_the_overview_follows_a_job_from_start_to_end_without_a_reload(
    admin_page: Any, live: Live
) -> None:
    page = admin_page
    page.goto(live.url + "/ui/")
    mark(page)
    before = (
        int(page.locator('td[data-state="SUCCEEDED"]').text_content() or 0)
        if (page.locator('td[data-state="SUCCEEDED"]').count())
        else 0
    )
    job = live.submit("sh", "-c", "sleep 2.5")
    page.wait_for_selector('td[data-state="RUNNING"]', timeout=WAIT_MS)
    page.wait_for_function(
        "n => Number(document.querySelector('td[data-state=SUCCEEDED]')?.textContent) > n",
        arg=before,
        timeout=WAIT_MS,
    )
    assert live.state(job) == "SUCCEEDED" and not_reloaded(page)
    shot(page, live, "overview")
    assert ERRORS[id(page)] == []


def test_a_jobs_logs_follow_live(admin_page: Any, live: Live) -> None:
    page = admin_page
    job = live.submit("sh", "-c", "echo first-line; sleep 2; echo second-line; sleep 1")
    eventually(lambda: live.state(job) == "RUNNING", timeout=20, what="the job to run")
    page.goto(f"{live.url}/ui/jobs/{job}")
    mark(page)
    page.wait_for_selector("#job-stdout:has-text('first-line')", timeout=WAIT_MS)
    assert "second-line" not in (page.text_content("#job-stdout") or "")
    page.wait_for_selector("#job-stdout:has-text('second-line')", timeout=WAIT_MS)
    page.wait_for_selector("#job-state:has-text('SUCCEEDED')", timeout=WAIT_MS)
    assert not_reloaded(page)
    shot(page, live, "job")


def test_approving_a_waiting_job_lets_it_run(admin_page: Any, live: Live) -> None:
    page = admin_page
    job = live.submit("sh", "-c", "echo approved-run", role="gated")
    assert live.state(job) == "AWAITING_APPROVAL"
    page.goto(live.url + "/ui/approvals")
    row = page.locator(f"tr:has(a[href='/ui/jobs/{job}'])")
    assert "echo approved-run" in (row.text_content() or "")
    shot(page, live, "approvals")
    row.locator("input[name=note]").first.fill("looks fine")
    row.locator("button:has-text('Approve')").click()
    page.wait_for_selector(f"tr:has(a[href='/ui/jobs/{job}']) >> text=looks fine")
    page.goto(f"{live.url}/ui/jobs/{job}")
    page.wait_for_selector("#job-state:has-text('SUCCEEDED')", timeout=WAIT_MS)
    assert "approved-run" in (page.text_content("#job-stdout") or "")


def test_a_kill_switch_stops_the_running_job_and_denies_the_next(
    admin_page: Any, live: Live
) -> None:
    page = admin_page
    running = live.submit("sleep", "60")
    eventually(lambda: live.state(running) == "RUNNING", timeout=20, what="the job to run")
    page.goto(live.url + "/ui/governance")
    page.fill("input[name=reason] >> nth=0", "runaway fleet")
    page.click("button:has-text('Engage kill switch')")
    page.wait_for_selector("text=runaway fleet")
    page.goto(f"{live.url}/ui/jobs/{running}")
    page.wait_for_selector("#job-state:has-text('KILLED')", timeout=WAIT_MS)
    denied = live.submit("true")
    eventually(lambda: live.state(denied) == "DENIED", timeout=20, what="the denial")
    page.goto(live.url + "/ui/governance")
    page.click("div.control:has-text('runaway fleet') button:has-text('Lift')")
    page.wait_for_selector("text=None in force.")
    after = live.submit("true")
    eventually(lambda: live.state(after) == "SUCCEEDED", timeout=20, what="a run after lifting")


def worker_crash(live: Live) -> None:
    """A failure of the worker itself (its shim killed while the command runs): what feeds a
    breaker."""
    job = live.submit("sleep", "60", role="crashy")
    eventually(lambda: live.state(job) == "RUNNING", timeout=20, what="the job to run")
    attempt = Path(live.corral.job(job)["attempts"][-1]["log_dir"])
    shim, child = (int((attempt / f).read_text()) for f in ("shim.pid", "child.pid"))
    os.kill(shim, signal.SIGSTOP)
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    eventually(lambda: not alive(child), what="the job's command to die")
    os.kill(shim, signal.SIGKILL)
    eventually(lambda: live.state(job) not in ("RUNNING", "STARTING"), what="the attempt's end")


def test_a_breaker_is_reset_and_a_dead_letter_requeued_from_the_mechanism_page(
    admin_page: Any, live: Live
) -> None:
    page = admin_page
    for _ in range(2):
        worker_crash(live)
    breakers = "/api/v1/breakers"
    eventually(
        lambda: any(
            b["name"] == "worker:alpha" and b["state"] == "OPEN" for b in live.api("GET", breakers)
        ),
        what="alpha's breaker to open",
    )
    dead = live.submit("sh", "-c", "exit 3", role="once")
    eventually(lambda: live.state(dead) == "DEAD_LETTERED", timeout=20, what="the dead letter")
    page.goto(live.url + "/ui/mechanism")
    page.click("tr[data-breaker='worker:alpha'] button:has-text('Reset')")
    page.wait_for_selector("tr[data-breaker='worker:alpha'] >> text=CLOSED")
    alpha = [b for b in live.api("GET", breakers) if b["name"] == "worker:alpha"]
    assert alpha[0]["state"] == "CLOSED"
    page.click(f"tr[data-dlq='{dead}'] button:has-text('Requeue')")
    page.wait_for_selector(f"a[href='/ui/jobs/{dead}']")  # the new job names its original
    fresh = (page.text_content("h1 code") or "").strip()
    assert fresh != dead and live.api("GET", f"/api/v1/jobs/{fresh}")["requeued_from"] == dead


def test_a_viewer_sees_no_action_and_a_forged_post_is_refused(browser: Any, live: Live) -> None:
    job = live.submit("sleep", "30")
    page = signed_in(browser, live, live.viewer)
    page.goto(f"{live.url}/ui/jobs/{job}")
    assert page.locator("form").count() == 1  # signing out only
    assert page.locator("button:has-text('Cancel job')").count() == 0
    csrf = page.locator("input[name=csrf]").first.input_value()
    r = page.request.post(f"{live.url}/ui/jobs/{job}/cancel", form={"csrf": csrf})
    assert r.status == 403
    assert live.state(job) in ("QUEUED", "STARTING", "RUNNING")
    live.api("POST", f"/api/v1/jobs/{job}/cancel")
    page.context.close()


def test_planted_html_never_becomes_an_element(admin_page: Any, live: Live) -> None:
    page = admin_page
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    job = live.submit("printf", "%s\n", PLANT)
    eventually(lambda: live.state(job) == "SUCCEEDED", timeout=20, what="the job")
    for path in (f"/ui/jobs/{job}", "/ui/jobs"):
        page.goto(live.url + path)
        page.wait_for_timeout(300)
        assert page.locator("#planted").count() == 0
        assert page.locator("img").count() == 0
        assert page.locator("script").count() == 1  # htmx, from the package
    assert PLANT in (page.text_content(f"tr[data-job='{job}']") or "")
    assert "<script>" in (page.text_content("body") or "") and dialogs == []
    assert ERRORS[id(page)] == []


def test_the_topology_draws_a_job_blocked_behind_a_running_one(admin_page: Any, live: Live) -> None:
    """A running job and one submitted `after` it: the topology page draws both boxes apart,
    the blocked_by edge between them, a link to each job, and runs no script of its own."""
    page = admin_page
    first = live.submit("sleep", "30")
    eventually(lambda: live.state(first) == "RUNNING", timeout=20, what="the first job")
    second = live.submit("true", after=[first])
    try:
        page.goto(live.url + "/ui/topology")
        page.wait_for_selector("svg#topology", timeout=WAIT_MS)
        boxes = {
            job: page.locator(f"svg#topology g.node[data-job='{job}'] rect").bounding_box()
            for job in (first, second)
        }
        a, b = boxes[first], boxes[second]
        assert a and b and a["width"] > 100 and a["height"] > 20
        apart = a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
        assert apart or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
        edge = page.locator(f"svg#topology path.edge.blocked_by[data-source='{second}']")
        assert edge.count() == 1 and edge.get_attribute("data-target") == first
        assert (edge.bounding_box() or {}).get("width", 0) > 0
        assert page.locator("svg#topology g.node.running").count() >= 1
        assert page.locator("script").count() == 1  # htmx, from the package
        shot(page, live, "topology")
        page.click(f"svg#topology g.node[data-job='{second}']")
        page.wait_for_url(f"{live.url}/ui/jobs/{second}")
        assert ERRORS[id(page)] == []
    finally:
        live.api("POST", f"/api/v1/jobs/{first}/cancel")
