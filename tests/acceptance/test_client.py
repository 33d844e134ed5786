"""The Python client (`corral.client`) against a live `corral serve` on loopback: a remote
control plane's round trip (submit → wait → logs → trace), a cancel, output followed until the
job ends, the rate limit's 429 surfaced with its Retry-After, and another tenant's job a
not-found error — through the blocking `Client` and the `AsyncClient` alike."""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from corral.client import ApiError, AsyncClient, Client
from corral.store.sqlite import SqliteStore
from tests.acceptance.conftest import CONFIG, Corral
from tests.helpers import eventually

# A small bucket: a token of its own runs dry within its burst.
RATED = CONFIG + "api:\n  rate_limit: {per_s: 0.5, burst: 40}\n"


@pytest.fixture
def rated(tmp_path: Path) -> Iterator[Corral]:
    c = Corral(tmp_path, RATED)
    try:
        yield c
    finally:
        c.stop_all()


def token(c: Corral, tenant: str, scopes: str = "jobs:read,jobs:write,approve,govern") -> str:
    return c.ok("token", "create", "--tenant", tenant, "--scopes", scopes).strip()


def serve_http(c: Corral) -> str:
    c.serve("--http", "127.0.0.1:0")
    return eventually(
        lambda: (
            (m := re.search(r"HTTP API on (http://127\.0\.0\.1:\d+)", c.engine_log()))
            and m.group(1)
        ),
        timeout=30,
        what="the engine to say where it serves HTTP",
    )


def test_client_round_trip_cancel_follow_rate_limit_and_tenants(rated: Corral) -> None:
    acme, globex, hammer = token(rated, "acme"), token(rated, "globex"), token(rated, "acme")
    admin = token(rated, "acme", "admin")
    url = serve_http(rated)
    with Client(url, acme) as c:
        made = c.submit(["sh", "-c", "echo one; sleep 0.5; echo two >&2"], key="k1")
        assert made.created and made.job.tenant == "acme" and made.job.key == "k1"
        again = c.submit(["sh", "-c", "echo one; sleep 0.5; echo two >&2"], key="k1")
        assert not again.created and again.job.id == made.job.id  # the key coalesces
        chunks = list(c.logs(made.job.id, follow=True))  # until the job ends
        assert "".join(ch.data for ch in chunks) == "one\n"
        done = c.wait(made.job.id, timeout_s=30)
        assert done.state.value == "SUCCEEDED"
        assert c.logs(made.job.id, stream="stderr").data == "two\n"
        shown = c.get(made.job.id)
        assert [a.state.value for a in shown.attempts] == ["SUCCEEDED"]
        assert c.trace(made.job.id).job == made.job.id
        ids = [j.id for j in c.iter_jobs(page_size=1)]  # cursor pages, one job each
        assert made.job.id in ids

        long = c.submit(["sleep", "60"]).job
        eventually(lambda: c.get(long.id).state.value == "RUNNING", what="the long job to run")
        cancelled = c.cancel(long.id, reason="the control plane changed its mind")
        assert cancelled.cancel_requested is not None
        assert c.wait(long.id, timeout_s=30).state.value == "CANCELLED"
        with pytest.raises(ApiError) as ended:
            c.cancel(long.id)
        assert ended.value.status == 409 and ended.value.code == "conflict"

        switch = c.engage_kill_switch("stop everything of acme")
        assert [s.dump()["id"] for s in c.kill_switches()] == [switch.dump()["id"]]
        c.lift_kill_switch(switch.dump()["id"])
        assert c.kill_switches() == []
        assert c.approvals() == []

    with Client(url, globex) as other, pytest.raises(ApiError) as hidden:
        other.get(made.job.id)
    assert hidden.value.status == 404 and hidden.value.code == "not_found"
    assert hidden.value.type.endswith("/not_found")

    async def hammer_until_refused() -> ApiError:
        async with AsyncClient(url, hammer) as h:
            for _ in range(200):
                try:
                    await h.list(limit=1)
                except ApiError as err:
                    return err
        raise AssertionError("200 calls and no 429 from a 40-call bucket")

    refused = anyio.run(hammer_until_refused)
    assert refused.status == 429 and refused.code == "rate_limited"
    assert refused.retry_after is not None and refused.retry_after >= 1

    with Client(url, "not-a-token") as stranger, pytest.raises(ApiError) as bad:
        stranger.list()
    assert bad.value.status == 401
    with pytest.raises(ApiError, match="http:// or https://"):
        Client("127.0.0.1:8765", acme)

    with Client(url, admin) as root:  # tokens over HTTP, as `corral token` makes them
        made = root.create_token(["jobs:read"], name="reader")
        with Client(url, made.token) as reader:
            assert reader.list(limit=1).jobs
            with pytest.raises(ApiError) as scoped:
                reader.submit(["true"])
            assert scoped.value.status == 403
            assert made.id in [t.id for t in root.tokens()]
            root.revoke_token(made.id)
            with pytest.raises(ApiError) as revoked:
                reader.list()
            assert revoked.value.status == 401
    cli_made = json.loads(
        rated.ok("token", "create", "--tenant", "x", "--scopes", "jobs:read", "--json")
    )
    rated.ok("token", "revoke", cli_made["id"])

    async def events() -> list[tuple[str, str, str]]:
        store = SqliteStore(rated.data / "corral.db")
        await store.open()
        try:
            return [(e.token_id, e.action, e.actor) for e in await store.token_events()]
        finally:
            await store.close()

    audited = anyio.run(events)
    user = getpass.getuser()
    assert (made.id, "created", made.created_by) in audited
    assert (made.id, "revoked", made.created_by) in audited  # the admin token's id
    assert (cli_made["id"], "created", user) in audited
    assert (cli_made["id"], "revoked", user) in audited
    db = b"".join(p.read_bytes() for p in rated.data.glob("corral.db*"))  # the WAL too
    assert made.token.encode() not in db and cli_made["token"].encode() not in db
    verified = rated.run("audit", "verify", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
