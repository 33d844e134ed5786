"""Engines on PostgreSQL: the real `corral serve`, and two of them sharing one database."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import httpx
import pytest

from corral.domain.tokens import split_token
from tests.acceptance.conftest import CORRAL, Corral
from tests.helpers import eventually
from tests.pg import PgSchemas

pytestmark = pytest.mark.postgres

CONFIG = """\
scheduler: {poll_interval_s: 0.2}
roles:
  default: {concurrency: 8}
environments:
  local: {max_inflight: 8}
"""


def _on_pg(c: Corral, dsn: str) -> dict[str, str]:
    env = c.env()
    env["CORRAL_STORE_URL"] = dsn
    return env


def test_two_engines_on_one_database_run_each_job_exactly_once(
    tmp_path: Path, pg_schemas: PgSchemas
) -> None:
    dsn = pg_schemas.new()
    runs = tmp_path / "runs"
    shared = CONFIG + f"audit: {{key_file: {tmp_path / 'audit.key'}}}\n"  # one key for both
    a, b = Corral(tmp_path / "a", shared), Corral(tmp_path / "b", shared)
    submit = subprocess.run(
        [str(Path(CORRAL).with_name("python")), "-c", _SUBMIT_500, str(runs)],
        env=_on_pg(a, dsn),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submit.returncode == 0, submit.stderr
    ids = submit.stdout.split()
    assert len(ids) == 500
    engines = [
        subprocess.Popen(
            [CORRAL, "serve", "--drain", "--no-http"],
            env=_on_pg(c, dsn),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for c in (a, b)
    ]
    for proc in engines:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()
    counts = Counter(runs.read_text().split())
    assert set(counts) == set(ids), "every job ran"
    assert max(counts.values()) == 1, "no job ran twice"
    jobs = subprocess.run(
        [CORRAL, "jobs", "--json", "--limit", "1000"],
        env=_on_pg(a, dsn),
        capture_output=True,
        text=True,
        timeout=60,
    )
    listed = json.loads(jobs.stdout)
    assert len(listed) == 500 and {j["state"] for j in listed} == {"SUCCEEDED"}
    assert {j["attempts"] for j in listed} == {1}
    # both engines took part (the split depends on timing, but neither may be idle)
    owners = subprocess.run(
        [
            "psql",
            dsn.split("?")[0],
            "-Atc",
            f"SET search_path TO {dsn.rsplit('%3D', 1)[-1]}; "
            "SELECT count(DISTINCT engine_id) FROM attempts",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert owners.stdout.split()[-1] == "2", owners.stderr
    # one unbroken timeline chain, written by both, matching each engine's checkpoints
    for c in (a, b):
        audit = subprocess.run(
            [CORRAL, "audit", "verify"],
            env=_on_pg(c, dsn),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert audit.returncode == 0, audit.stderr
        assert audit.stdout.startswith("audit ok: ") and "0 checkpoints" not in audit.stdout


_SUBMIT_500 = """
import sys, anyio
from corral.config import load
from corral.domain.models import JobSpec
from corral.runtime.assembly import build_store
from corral.services.submissions import submissions

async def main():
    cfg = load()
    store = build_store(cfg)
    await store.open()
    svc = submissions(store, cfg)
    script = 'echo "$CORRAL_JOB_ID" >> ' + sys.argv[1]
    for _ in range(500):
        print((await svc.submit(JobSpec(command=("sh", "-c", script)))).job.id)
    await store.close()

anyio.run(main)
"""


def test_a_single_engine_on_postgres_runs_the_lifecycle(
    tmp_path: Path, pg_schemas: PgSchemas
) -> None:
    c = Corral(tmp_path, CONFIG)
    dsn = pg_schemas.new()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CORRAL, *args], env=_on_pg(c, dsn), capture_output=True, text=True, timeout=60
        )

    ok = run("submit", "--", "true").stdout.strip()
    bad = run("submit", "--max-attempts", "2", "--", "sh", "-c", "exit 4").stdout.strip()
    engine = subprocess.Popen(
        [CORRAL, "serve", "--drain", "--no-http"], env=_on_pg(c, dsn), stderr=subprocess.PIPE
    )
    _, err = engine.communicate(timeout=60)
    assert engine.returncode == 0, err.decode()
    assert run("wait", ok).returncode == 0
    assert run("wait", bad).returncode == 4
    shown = json.loads(run("show", bad, "--json").stdout)
    assert shown["state"] == "DEAD_LETTERED" and len(shown["attempts"]) == 2


def _http_url(c: Corral) -> str:
    return str(
        eventually(
            lambda: (
                (m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)", c.engine_log()))
                and m.group(1)
            ),
            timeout=120,  # three engines starting at once on a loaded machine
            what="the engine to say where it serves HTTP",
        )
    )


def test_a_dashboard_session_begun_on_one_engine_holds_on_the_other(
    tmp_path: Path, pg_schemas: PgSchemas
) -> None:
    """Two engines on one database behind (say) a load balancer: the sign-in form one served is
    accepted by the other, the session cookie one set is good on the other, and revoking the
    token ends the session on both; an engine with another secrets key accepts none of it."""
    dsn = pg_schemas.new()
    keys = f"audit: {{key_file: {tmp_path / 'audit.key'}}}\n"
    shared = CONFIG + keys + f"secrets: {{key_file: {tmp_path / 'secrets.key'}}}\n"
    stranger = CONFIG + keys + f"secrets: {{key_file: {tmp_path / 'other.key'}}}\n"
    a, b = Corral(tmp_path / "a", shared), Corral(tmp_path / "b", shared)
    x = Corral(tmp_path / "x", stranger)
    made = subprocess.run(
        [CORRAL, "token", "create", "--tenant", "acme", "--scopes", "admin"],
        env=_on_pg(a, dsn),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    engines = []
    try:
        for c in (a, b, x):
            engines.append(
                subprocess.Popen(
                    [CORRAL, "serve", "--http", "127.0.0.1:0"],
                    env=_on_pg(c, dsn),
                    stdout=(c.data / "engine-test.log").open("ab"),
                    stderr=subprocess.STDOUT,
                )
            )
        url_a, url_b, url_x = (_http_url(c) for c in (a, b, x))
        with httpx.Client(timeout=30) as browser:
            form = browser.get(f"{url_a}/ui/login")  # the form from A …
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf, form.text
            signed = browser.post(  # … posted to B (its nonce cookie goes along)
                f"{url_b}/ui/login", data={"token": token, "csrf": csrf.group(1)}
            )
            assert signed.status_code == 303, signed.text
            assert "corral_session" in browser.cookies
            for url in (url_a, url_b):
                page = browser.get(f"{url}/ui/jobs")
                assert page.status_code == 200 and "Sign in" not in page.text, url
            refused = browser.get(f"{url_x}/ui/jobs")
            assert (refused.status_code, refused.headers.get("location")) == (303, "/ui/login")
            revoke = subprocess.run(
                [CORRAL, "token", "revoke", split_token(token)[0]],  # type: ignore[index]
                env=_on_pg(b, dsn),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert revoke.returncode == 0, revoke.stderr
            for url in (url_a, url_b):
                ended = browser.get(f"{url}/ui/jobs")
                assert (ended.status_code, ended.headers.get("location")) == (303, "/ui/login")
    finally:
        for proc in engines:
            proc.terminate()
        for proc in engines:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
