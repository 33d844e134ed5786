"""The `corral` command against a remote engine (`--url` / `CORRAL_URL`, `CORRAL_TOKEN`): the
job commands, kill switches, approvals and the dead-letter queue go through the HTTP API of a
live `corral serve` and print what the same commands print locally, ending with the same exit
codes (404 → 4, 409 → 5, 401/403 → 10, 429 → 75); a local-only command says so."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.conftest import CONFIG, CORRAL, Corral
from tests.acceptance.test_client import serve_http, token

RATED = CONFIG + "api:\n  rate_limit: {per_s: 0.01, burst: 200}\n"


@pytest.fixture
def rated(tmp_path: Path) -> Iterator[Corral]:
    c = Corral(tmp_path, RATED)
    try:
        yield c
    finally:
        c.stop_all()


def remote(
    c: Corral, url: str, tok: str, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` with no data directory of its own: only CORRAL_URL and CORRAL_TOKEN."""
    env = c.env()
    env.pop("CORRAL_DATA_DIR")
    env.pop("CORRAL_CONFIG")
    env.update(CORRAL_URL=url, CORRAL_TOKEN=tok, HOME=str(c.work))
    return subprocess.run(
        [CORRAL, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=c.work,
        stdin=subprocess.DEVNULL,
    )


def test_the_cli_against_a_remote_engine(rated: Corral) -> None:
    c = rated
    acme, globex, dry = token(c, "acme"), token(c, "globex"), token(c, "acme")
    url = serve_http(c)

    def ok(*args: str) -> str:
        r = remote(c, url, acme, *args)
        assert r.returncode == 0, f"{args} → {r.returncode}\n{r.stderr}"
        return r.stdout

    job = ok("submit", "--", "sh", "-c", "echo hello-remote; echo oops >&2").strip()
    assert remote(c, url, acme, "wait", job, "--timeout", "30").returncode == 0
    r = remote(c, url, acme, "logs", job)
    assert (r.stdout, r.stderr) == ("hello-remote\n", "oops\n")
    assert json.loads(ok("show", job, "--json")) == c.job(job)  # as the local command prints it
    listed = json.loads(ok("jobs", "--json"))
    assert listed == c.json("jobs") and listed[0]["id"] == job
    assert ok("show", job) == c.ok("show", job)
    assert json.loads(ok("trace", job, "--json")) == c.json("trace", job)

    failing = remote(c, url, acme, "submit", "--wait", "--", "sh", "-c", "exit 3")
    assert failing.returncode == 3, failing.stderr
    followed = remote(c, url, acme, "submit", "--follow", "--", "sh", "-c", "echo a; echo b")
    assert followed.returncode == 0 and followed.stdout.splitlines()[1:] == ["a", "b"]

    long = ok("submit", "--json", "--", "sleep", "60")
    long_id = json.loads(long)["id"]
    assert remote(c, url, acme, "wait", long_id, "--for", "running").returncode == 0
    assert "cancel requested" in ok("cancel", long_id, "--reason", "remote stop")
    assert remote(c, url, acme, "wait", long_id, "--timeout", "30").returncode == 130
    assert remote(c, url, acme, "cancel", long_id).returncode == 5  # 409: it has ended

    switch = json.loads(ok("kill-switch", "on", "--scope", "tenant", "--reason", "r", "--json"))
    assert switch["target"] == "acme" and switch["created_by"].startswith("token:")
    assert switch["id"] in ok("kill-switch", "status")
    assert "lifted 1 kill switch" in ok("kill-switch", "off", switch["id"])
    assert ok("approvals", "list").strip() == "no approvals"
    dead = json.loads(ok("dlq", "list", "--json"))  # the `exit 3` job, its retries spent
    assert dead == c.json("dlq", "list") and len(dead) == 1
    again = json.loads(ok("dlq", "requeue", dead[0]["id"], "--json"))
    assert again["requeued_from"] == dead[0]["id"]

    other = remote(c, url, globex, "show", job)  # another tenant's job does not exist
    assert other.returncode == 4 and "corral: error:" in other.stderr
    bad = remote(c, url, "corral_nope", "jobs")
    assert bad.returncode == 10 and "token" in bad.stderr
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {dry}"}) as h:
        while h.get("/api/v1/jobs", params={"limit": 1}).status_code != 429:
            pass  # spend the bucket
    limited = remote(c, url, dry, "jobs")
    assert limited.returncode == 75 and "rate limit" in limited.stderr

    local = remote(c, url, acme, "status")
    assert local.returncode == 2 and "local data directory only" in local.stderr
    notoken = remote(c, url, "", "jobs")
    assert notoken.returncode == 10 and "CORRAL_TOKEN" in notoken.stderr
    grace = remote(c, url, acme, "submit", "--grace", "3", "--", "true")
    assert grace.returncode == 2 and "--grace" in grace.stderr
