"""The `corral` command against a remote engine (`--url` / `CORRAL_URL`, `CORRAL_TOKEN`): the
job commands, kill switches, approvals and the dead-letter queue go through the HTTP API of a
live `corral serve` and print what the same commands print locally, ending with the same exit
codes (404 → 4, 409 → 5, 401/403 → 10, 429 → 75); so do the epic commands but `epic run`;
a local-only command says so."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import httpx
import pytest

from corral.domain.epics import EpicState, TaskRecord, TaskState
from corral.store.sqlite import SqliteStore
from tests.acceptance.conftest import CONFIG, CORRAL, Corral
from tests.acceptance.test_client import serve_http, token
from tests.unit.test_api_epics import epic

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


def _shared(ids: list[str]) -> str:
    """The first characters all of `ids` share."""
    first, last = min(ids), max(ids)
    n = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first))
    return first[:n]


def test_the_remote_cli_names_jobs_by_unique_prefix_or_suffix_like_the_local_one(
    tmp_path: Path,
) -> None:
    c = Corral(tmp_path, CONFIG)
    try:
        acme, globex = token(c, "acme"), token(c, "globex")
        url = serve_http(c)

        def submit(tok: str, *argv: str) -> str:
            r = remote(c, url, tok, "submit", "--", *argv)
            assert r.returncode == 0, r.stderr
            return r.stdout.strip()

        mine = [submit(acme, "sh", "-c", "echo from-$CORRAL_JOB_ID") for _ in range(2)]
        theirs = submit(globex, "true")
        for job_id in mine:
            assert remote(c, url, acme, "wait", job_id[-6:], "--timeout", "30").returncode == 0
        shared = _shared([*mine, theirs])
        assert len(shared) >= 4  # ids made close together share their first characters

        # a unique suffix or prefix names the job, as locally: the same output
        suffix = mine[0][-6:]
        assert remote(c, url, acme, "show", suffix).stdout == c.ok("show", suffix)
        shown = json.loads(remote(c, url, acme, "show", mine[1][:-1], "--json").stdout)
        assert shown["id"] == mine[1]
        logs = remote(c, url, acme, "logs", suffix)
        assert logs.returncode == 0 and logs.stdout == f"from-{mine[0]}\n"
        assert json.loads(remote(c, url, acme, "trace", suffix, "--json").stdout)["job"] == mine[0]

        # ambiguous among the tenant's jobs: the local command's error and exit code
        ambiguous = _shared(mine)
        here = c.run("show", ambiguous)
        there = remote(c, url, acme, "show", ambiguous)
        assert here.returncode == there.returncode == 2
        assert "ambiguous" in there.stderr and mine[0] in there.stderr
        assert theirs not in there.stderr  # another tenant's job is never named
        # names none of the tenant's: "no job", exit code 4 — also when it names another
        # tenant's job, whose existence does not leak
        for ref in ("ZZZZZZ", theirs[-6:], theirs):
            r = remote(c, url, acme, "show", ref)
            assert r.returncode == 4 and f"no job {ref}" in r.stderr, r.stderr
        assert c.run("show", "ZZZZZZ").returncode == 4
        # what names several jobs across tenants names one of globex's
        assert json.loads(remote(c, url, globex, "show", shared, "--json").stdout)["id"] == theirs

        # a job's kill switch names the job as locally; one is lifted by its id's prefix too
        def switch(*args: str) -> subprocess.CompletedProcess[str]:
            return remote(c, url, acme, "kill-switch", *args, "--json")

        on = switch("on", "--scope", "job", "--target", suffix, "--reason", "r")
        assert on.returncode == 0, on.stderr
        first = json.loads(on.stdout)
        assert (first["scope"], first["target"]) == ("job", mine[0])
        off = switch("off", "--scope", "job", "--target", mine[0][:-1])
        assert [s["id"] for s in json.loads(off.stdout)] == [first["id"]], off.stderr
        again = json.loads(
            switch("on", "--scope", "job", "--target", mine[1][-6:], "--reason", "r").stdout
        )
        assert again["target"] == mine[1]
        lifted = json.loads(switch("off", again["id"][:-2]).stdout)
        assert [s["id"] for s in lifted] == [again["id"]]
        for ref in (theirs[-6:], ambiguous):  # another tenant's: not found; several: ambiguous
            refused = switch("on", "--scope", "job", "--target", ref, "--reason", "r")
            assert refused.returncode == (4 if ref != ambiguous else 2), refused.stderr

        long = submit(acme, "sleep", "60")
        cancelled = remote(c, url, acme, "cancel", long[-6:], "--json")
        assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["id"] == long
    finally:
        c.stop_all()


def test_epic_status_show_and_cancel_against_a_remote_engine(tmp_path: Path) -> None:
    """`corral epic status|show|cancel` with `--url` print what they print locally, for the
    token's tenant only; cancelling an ended epic is a conflict (exit 5) there as here, and
    `epic run` names a file and a repository of this machine, so it stays local."""
    c = Corral(tmp_path, CONFIG)
    try:
        acme, globex = token(c, "acme"), token(c, "globex")
        url = serve_http(c)
        anyio.run(_seed_ended_epic, c.data / "corral.db")
        for args in (("epic", "status", "--json"), ("epic", "show", "ep-remote", "--json")):
            r = remote(c, url, acme, *args)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout) == json.loads(c.ok(*args)), args
        assert remote(c, url, acme, "epic", "show", "ep-rem").stdout == c.ok(
            "epic", "show", "ep-rem"
        )  # a unique prefix, and the same table
        other = remote(c, url, globex, "epic", "status", "--json")
        assert (other.returncode, json.loads(other.stdout)) == (0, [])
        assert remote(c, url, globex, "epic", "show", "ep-remote").returncode == 4
        ended = remote(c, url, acme, "epic", "cancel", "ep-remote")
        assert ended.returncode == c.run("epic", "cancel", "ep-remote").returncode == 5
        refused = remote(c, url, acme, "epic", "run", "epic.yaml")
        assert refused.returncode != 0 and "local data directory only" in refused.stderr
    finally:
        c.stop_all()


async def _seed_ended_epic(db: Path) -> None:
    """An epic of tenant acme that has ended (the engine leaves it as it is)."""
    store = SqliteStore(db)
    await store.open()
    try:
        record = replace(epic("ep-remote", "acme"), state=EpicState.DONE, wave=1)
        task = TaskRecord(epic_id="ep-remote", task_id="a", position=0, state=TaskState.PASSED)
        await store.create_epic(record, [task])
    finally:
        await store.close()
