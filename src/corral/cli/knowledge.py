"""`corral knowledge`: the learnings Corral extracted from finished runs (services/knowledge.py),
what each run was given, and whether giving them pays (docs/how-to/knowledge.md)."""

from __future__ import annotations

import datetime as dt
import getpass
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.domain.errors import CorralError
from corral.domain.ids import shortest
from corral.services import knowledge

from .edge import config_or_fail, emit, remote_url, through_api, with_store
from .exits import fail
from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, id_column, new_table

if TYPE_CHECKING:
    from pathlib import Path

    from corral.client import AsyncClient
    from corral.core.ports import Store

app = typer.Typer(
    no_args_is_help=True,
    help="The knowledge flywheel: learnings extracted from finished runs, scored, decayed and "
    "injected into later runs of their role; promote, retire, and see whether it pays.",
)

RoleOpt = Annotated[str | None, typer.Option("--role", help="Only this role's learnings.")]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's learnings.")]
LimitOpt = Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")]
Ref = Annotated[
    str,
    typer.Argument(help="A learning (its id, or a unique prefix or suffix of 4+ characters)."),
]


def _status(text: str) -> Any:
    try:
        return knowledge.status_of(text)
    except CorralError as err:
        fail(err)


def _out(text: str) -> None:
    """A line as written: a learning's text comes from an agent's run, never read as markup."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _remote(tenant: str | None, call: Callable[[AsyncClient], Awaitable[Any]]) -> Any:
    """With `--url`: the answer of the remote engine's API (the token's tenant), dumped to the
    local command's JSON shape; None without a URL."""
    if tenant is not None and (url := remote_url()) is not None:
        from . import remote

        fail(remote.local_only("--tenant (the token's tenant is used)", url))
    found = through_api(call)
    if found is None:
        return None
    return [x.dump() for x in found] if isinstance(found, list) else found.dump()


def _day(t: float | None) -> str:
    return "-" if t is None else dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def _table(rows: list[dict[str, Any]], title: str) -> None:
    """Short ids (the shortest unique suffix among those shown), the title clipped: `show`
    prints the rest (role, scores, citations), `--json` everything."""
    from rich.text import Text

    short = shortest([r["id"] for r in rows], [r["id"] for r in rows])
    table = new_table(title=title)
    id_column(table, "id", list(short.values()))
    for col in ("kind", "tier", "status", "utility"):
        table.add_column(col, no_wrap=True)
    table.add_column("title", no_wrap=True, overflow="ellipsis", max_width=28)
    for r in rows:
        table.add_row(
            *(
                Text(str(v))
                for v in (
                    short[r["id"]],
                    r["kind"],
                    r["tier"],
                    r["status"],
                    f"{r['utility']:.2f}",
                    r["title"],
                )
            )
        )
    console.print(table)


@app.command("list")
def list_cmd(
    role: RoleOpt = None,
    tenant: TenantOpt = None,
    status: Annotated[
        str, typer.Option("--status", help="active, pending (a human's), retired, or all.")
    ] = "all",
    limit: LimitOpt = 50,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """The learnings, newest first: kind, tier, status, utility and title (`--json`: every
    field, with confidence and freshness decayed to now)."""
    wanted = _status(status)
    rows = _remote(tenant, lambda c: c.learnings(role=role, status=status, limit=limit))
    if rows is None:
        cfg = config_or_fail(data_dir, config)
        found = with_store(
            cfg,
            lambda st: st.list_learnings(tenant=tenant, role=role, status=wanted, limit=limit),
        )
        rows = [knowledge.learning_view(x, time.time()) for x in found]
    if as_json:
        emit(rows)
    elif not rows:
        _out("no learnings yet: they are extracted as agent runs end")
    else:
        _table(rows, "learnings")


@app.command("search")
def search_cmd(
    query: Annotated[str, typer.Argument(help="Words to look for (any of them).")],
    role: RoleOpt = None,
    tenant: TenantOpt = None,
    status: Annotated[
        str, typer.Option("--status", help="active, pending, retired, or all.")
    ] = "active",
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Full-text search of the learnings' titles and bodies (the store's own index: SQLite
    FTS5, PostgreSQL tsvector), best match first."""
    wanted = _status(status)
    rows = _remote(tenant, lambda c: c.learnings(query, role=role, status=status, limit=limit))
    if rows is None:
        cfg = config_or_fail(data_dir, config)
        found = with_store(
            cfg,
            lambda st: st.search_learnings(
                query, tenant=tenant, role=role, status=wanted, limit=limit
            ),
        )
        rows = [knowledge.learning_view(x, time.time()) for x in found]
    if as_json:
        emit(rows)
    elif not rows:
        _out(f"no learning matches {query!r}")
    else:
        _table(rows, f"learnings matching {query!r}")


@app.command("show")
def show_cmd(
    ref: Ref, as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """One learning: its text, scores now (confidence and freshness decayed), provenance (job,
    attempt, commit), the history of its score changes and the attempts it was given to."""

    async def remote_show(c: AsyncClient) -> Any:
        return await c.learning(await c.resolve_learning(ref))

    shown = _remote(None, remote_show)
    if shown is None:
        cfg = config_or_fail(data_dir, config)
        shown = with_store(cfg, lambda st: knowledge.show(st, ref)).view(time.time())
    if as_json:
        emit(shown)
        return
    p = shown["provenance"]
    _out(f"{shown['id']}  {shown['kind']} · {shown['tier']} · {shown['status']}")
    _out(f"title:      {shown['title']}")
    _out(f"scope:      tenant {shown['tenant']}, role {shown['role']}")
    _out(
        f"score:      {shown['score']:.4f} (rubric)  utility {shown['utility']:.4f}  "
        f"confidence {shown['confidence_now']:.4f} now  freshness {shown['freshness']:.4f}"
    )
    _out(
        f"maturity:   {shown['maturity']}  rewards {shown['rewards']} (helpful "
        f"{shown['helpful']}, harmful {shown['harmful']})  citations {shown['citations']}"
    )
    _out(
        f"provenance: job {p['job_id'] or '-'} attempt {p['attempt'] or '-'} "
        f"commit {p['commit'] or '-'}"
    )
    _out("")
    _out(shown["body"])
    _out("")
    _out("history:")
    for h in shown["history"]:
        u = h["utility"]
        moved = f" utility {u[0]:.4f} → {u[1]:.4f}" if None not in u and u[0] != u[1] else ""
        m = h["maturity"]
        matured = f" maturity {m[0]} → {m[1]}" if None not in m and m[0] != m[1] else ""
        s = h["status"]
        status = f" status {s[0] or '-'} → {s[1]}" if s[1] is not None and s[0] != s[1] else ""
        _out(
            f"  {_day(h['at'])} {h['action']} by {h['actor']}{moved}{matured}{status}"
            + (f": {h['reason']}" if h["reason"] else "")
        )
    if shown["cited_by"]:
        _out("given to:")
        for c in shown["cited_by"]:
            reward = "-" if c["reward"] is None else f"{c['reward']:g}"
            _out(
                f"  {_day(c['at'])} job {c['job_id']} attempt {c['attempt']} rank "
                f"{c['rank']} reward {reward}"
            )


def _decide(
    remote: Callable[[AsyncClient], Awaitable[Any]],
    local: Callable[[Store], Awaitable[Any]],
    data_dir: Path | None,
    config: Path | None,
) -> Any:
    """A change to one learning: through the remote engine's API with `--url` (as the local
    command's shape), else on the store."""
    found = _remote(None, remote)
    if found is not None:
        return found
    return with_store(config_or_fail(data_dir, config), local)


def _changed(found: Any, as_json: bool, verb: str) -> None:
    view = found if isinstance(found, dict) else knowledge.learning_view(found, time.time())
    if as_json:
        emit(view)
    else:
        _out(f"{verb} {view['id']} ({view['kind']} · {view['tier']}): {view['title']}")


@app.command("promote")
def promote_cmd(
    ref: Ref,
    note: Annotated[str, typer.Option("--note", help="Why (kept in its history).")] = "",
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Approve a pending learning (a bronze one waits for a human): runs of its role are given
    it from now on."""

    async def remote(c: AsyncClient) -> Any:
        return await c.promote_learning(await c.resolve_learning(ref), note)

    async def local(st: Store) -> Any:
        return await knowledge.promote(st, ref, by=getpass.getuser(), note=note)

    _changed(_decide(remote, local, data_dir, config), as_json, "promoted")


@app.command("retire")
def retire_cmd(
    ref: Ref,
    reason: Annotated[str, typer.Option("--reason", help="Why (required; kept in its history).")],
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Stop giving a learning to runs (it is kept, with its history; retiring is final)."""

    async def remote(c: AsyncClient) -> Any:
        return await c.retire_learning(await c.resolve_learning(ref), reason)

    async def local(st: Store) -> Any:
        return await knowledge.retire(st, ref, by=getpass.getuser(), reason=reason)

    _changed(_decide(remote, local, data_dir, config), as_json, "retired")


@app.command("stats")
def stats_cmd(
    role: RoleOpt = None,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Whether the flywheel pays: per role, the finished runs given learnings and those not
    (a role's `knowledge: ab` splits them by job id), their success rate and tool calls per
    run, and the difference; and how many learnings are active, pending and retired."""
    found = _remote(tenant, lambda c: c.knowledge_stats(role))
    if found is None:
        cfg = config_or_fail(data_dir, config)
        found = with_store(cfg, lambda st: knowledge.stats(st, tenant=tenant, role=role))
    if as_json:
        emit(found)
        return
    n = found["learnings"]
    _out(f"learnings: {n['active']} active, {n['pending']} pending, {n['retired']} retired")
    if not found["roles"]:
        _out("no finished runs of a role with knowledge on or ab yet")
        return
    from rich.text import Text

    table = new_table(title="runs with and without learnings")
    for col in ("role", "arm", "runs", "success rate", "tool calls/run", "uplift"):
        table.add_column(col)
    for r in found["roles"]:
        for arm in ("with", "without"):
            a = r[arm]
            if a is None:
                continue
            up = r["uplift"]
            uplift = (
                f"{up['success_rate']:+.1%} success, {up['tool_calls_per_run']:+g} calls"
                if up and arm == "with"
                else ""
            )
            table.add_row(
                Text(r["role"]),
                arm,
                str(a["runs"]),
                f"{a['success_rate']:.1%}",
                f"{a['tool_calls_per_run']:g}",
                uplift,
            )
    console.print(table)
