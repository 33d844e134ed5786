"""`corral knowledge` on a data directory whose store holds learnings (written here the way the
engine's flywheel writes them): list, search, show, promote, retire and stats, in tables and
JSON, with clear errors; an agent's text is printed as written, never read as markup."""

from __future__ import annotations

import asyncio
import json
from unittest.mock import ANY

from corral.runtime.flywheel import Flywheel
from corral.store.sqlite import SqliteStore
from tests.acceptance.conftest import Corral
from tests.unit.test_flywheel import agent_job, event, settings

MARKUP = "Turns out the cache was stale [red]all[/red] along."


def seed(c: Corral) -> None:
    async def main() -> None:
        store = SqliteStore(c.data / "corral.db")
        await store.open()
        try:
            wheel = Flywheel(store, settings())
            for final in (None, MARKUP):
                job = agent_job(cwd=str(c.work))
                await wheel.settle(job, [event(job) if final is None else event(job, final=final)])
        finally:
            await store.close()

    asyncio.run(main())


def test_knowledge_commands(corral: Corral) -> None:
    c = corral
    assert "no learnings yet" in c.ok("knowledge", "list")
    seed(c)
    rows = c.json("knowledge", "list")
    assert [(r["kind"], r["tier"], r["status"]) for r in rows] == [
        ("learning", "bronze", "pending"),
        ("solution", "gold", "active"),
    ]
    pending, gold = rows
    table = c.ok("knowledge", "list")
    assert gold["id"][-6:] in table and "pending" in table
    assert [r["id"] for r in c.json("knowledge", "search", "flaky seed")] == [gold["id"]]
    assert c.json("knowledge", "search", "stale") == []  # pending: not active
    assert [r["id"] for r in c.json("knowledge", "search", "stale", "--status", "all")] == [
        pending["id"]
    ]
    shown = c.ok("knowledge", "show", pending["id"][-6:])
    assert MARKUP in shown and "waits for a human" in shown  # printed as written
    promoted = c.json("knowledge", "promote", pending["id"], "--note", "checked by hand")
    assert promoted["status"] == "active"
    history = c.json("knowledge", "show", pending["id"])["history"]
    assert [(h["action"], h["reason"]) for h in history][-1] == ("promoted", "checked by hand")
    for args, message in (
        (("promote", pending["id"]), "only a learning that is pending can be promoted"),
        (("retire", gold["id"]), "missing option '--reason'"),
        (("show", "nope"), "no learning nope"),
        (("list", "--status", "bogus"), "unknown status 'bogus'"),
    ):
        r = c.run("knowledge", *args)
        assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert c.json("knowledge", "retire", gold["id"], "--reason", "obsolete")["status"] == "retired"
    stats = c.json("knowledge", "stats")
    assert stats["learnings"] == {"active": 1, "pending": 0, "retired": 1}
    assert stats["roles"] == []  # no run was dispatched by an engine here
    assert "learnings: 1 active, 0 pending, 1 retired" in c.ok("knowledge", "stats")


def test_knowledge_commands_against_a_remote_engine(corral: Corral) -> None:
    """`corral knowledge … --url`: the token's tenant's learnings through the HTTP API, printed
    as the local commands print them; another tenant's token sees none of them."""
    from tests.acceptance.test_client import serve_http, token
    from tests.acceptance.test_remote_cli import remote

    c = corral
    seed(c)  # two learnings of tenant `default`
    mine, theirs = token(c, "default"), token(c, "globex")
    url = serve_http(c)

    def ok(tok: str, *args: str) -> str:
        r = remote(c, url, tok, "knowledge", *args)
        assert r.returncode == 0, f"{args} → {r.returncode}\n{r.stderr}"
        return r.stdout

    listed = json.loads(ok(mine, "list", "--json"))
    assert [x["id"] for x in listed] == [x["id"] for x in c.json("knowledge", "list")]
    pending, gold = listed
    assert json.loads(ok(mine, "search", "flaky seed", "--json"))[0]["id"] == gold["id"]
    assert MARKUP in ok(mine, "show", pending["id"])  # printed as written, over HTTP too
    assert json.loads(ok(mine, "show", gold["id"], "--json")) == c.json(
        "knowledge", "show", gold["id"]
    ) | {"confidence_now": ANY, "freshness": ANY}
    # a unique prefix or suffix names a learning over HTTP as it does locally
    assert json.loads(ok(mine, "show", gold["id"][-6:], "--json"))["id"] == gold["id"]
    assert json.loads(ok(theirs, "list", "--json")) == []
    r = remote(c, url, theirs, "knowledge", "show", gold["id"])
    assert r.returncode == 4 and "no learning" in r.stderr  # not found: not said to exist
    r = remote(c, url, theirs, "knowledge", "show", gold["id"][-6:])
    assert r.returncode == 4 and "no learning" in r.stderr  # nor by a short id
    r = remote(c, url, theirs, "knowledge", "retire", gold["id"], "--reason", "mine now")
    assert r.returncode == 4
    promoted = json.loads(ok(mine, "promote", pending["id"], "--note", "ok", "--json"))
    assert promoted["status"] == "active"
    last = c.json("knowledge", "show", pending["id"])["history"][-1]
    assert last["actor"].startswith("token:") and last["reason"] == "ok"
    assert json.loads(ok(mine, "stats", "--json"))["learnings"]["active"] == 2
    r = remote(c, url, mine, "knowledge", "list", "--tenant", "globex")
    assert r.returncode != 0 and "--tenant" in r.stderr and "Traceback" not in r.stderr
