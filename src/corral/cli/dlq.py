"""`corral dlq list|show|requeue|purge`: the dead-letter queue (services/dlq.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from corral.domain.errors import InvalidRequest
from corral.runtime.control import operator_only
from corral.services import dlq, queries

from . import views
from .edge import config_or_fail, emit, note, remote_url, waker, with_store
from .exits import fail
from .jobs import print_job_list, show

if TYPE_CHECKING:
    from corral.client import AsyncClient
from .options import ConfigOpt, DataDir, JsonOpt

app = typer.Typer(
    no_args_is_help=True,
    help="The dead-letter queue: jobs whose retries ran "
    "out. Inspect, requeue with a fresh budget, "
    "or purge.",
)


@app.command("list")
def dlq_list(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Dead-lettered jobs not yet requeued or purged."""
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        page = remote.run(url, lambda c: c.dlq(limit=limit))
        if as_json:
            emit([remote.list_json(j) for j in page.jobs])
        else:
            views.print_jobs([remote.job(j) for j in page.jobs], title="dead-letter queue")
        return
    cfg = config_or_fail(data_dir, config)
    query = dlq.dead_lettered(limit)
    found = with_store(cfg, lambda st: queries.jobs(st, query, short=not as_json))
    if as_json:
        emit([views.job_json(j) for j in found.jobs])
    else:
        print_job_list(found, title="dead-letter queue")


@app.command("show")
def dlq_show(
    job: str, as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """A dead-lettered job with its attempts and last error."""
    show(job, as_json=as_json, data_dir=data_dir, config=config)


@app.command("requeue")
def dlq_requeue(
    job: str, as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """Submit a fresh copy of a dead-lettered job with a fresh attempt budget (recorded on both)."""
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        r = remote.run(url, lambda c: remote.on_job(c, job, c.requeue))
        if as_json:
            emit(r.dump())
        else:
            typer.echo(r.id)
        return
    cfg = config_or_fail(data_dir, config)
    operator_only(cfg.data_dir, "dlq requeue")
    new = with_store(cfg, lambda st: dlq.requeue(st, cfg, job, wake=waker(cfg), notify=note))
    if as_json:
        emit({"id": new.id, "requeued_from": new.requeued_from, "state": new.state.value})
    else:
        typer.echo(new.id)


@app.command("purge")
def dlq_purge(
    jobs_: Annotated[
        list[str] | None,
        typer.Argument(metavar="JOB...", help="Jobs to purge.", show_default=False),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Purge every listed job.")] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Drop jobs from the dead-letter queue. Their records, attempts and logs stay."""
    if not jobs_ and not all_:
        fail(InvalidRequest("name the jobs to purge, or pass --all"))
    if (url := remote_url()) is not None:
        from . import remote  # with its client: only when a URL is given

        async def purge(c: AsyncClient) -> list[str]:
            named = [await c.resolve(ref) for ref in jobs_ or []]
            return (await c.purge(named, every=all_)).purged

        done = remote.run(url, purge)
    else:
        cfg = config_or_fail(data_dir, config)
        operator_only(cfg.data_dir, "dlq purge")
        done = with_store(cfg, lambda st: dlq.purge(st, cfg, jobs_ or [], every=all_))
    if as_json:
        emit({"purged": done})
    else:
        typer.echo(f"purged {len(done)} job(s)")
