"""`corral events`: the core's recorded decisions (the group's own command), and `corral events
tail`, which follows what the engine publishes to a sink (docs/how-to/events.md)."""

from __future__ import annotations

import json
from typing import Annotated

import anyio
import typer

from corral.domain.errors import CorralError
from corral.services import events as svc

from . import jobs
from .edge import config_or_fail
from .exits import fail
from .options import ConfigOpt, DataDir, JsonOpt

app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


@app.callback()
def core_events(
    ctx: typer.Context,
    kind: Annotated[
        str | None,
        typer.Option("--kind", help="breaker, defense, escalation or permit (default: all)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 50,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """The core's recorded decisions: breaker transitions, defense stages, escalations.
    `corral events tail` follows the events the engine publishes."""
    if ctx.invoked_subcommand is None:
        jobs.events(kind=kind, limit=limit, as_json=as_json, data_dir=data_dir, config=config)


@app.command("tail")
def tail(
    sink: Annotated[
        str | None,
        typer.Option("--sink", help="The sink to follow, by name (default: the first configured)."),
    ] = None,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Begin with the oldest event the sink keeps.")
    ] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Follow the events published to a sink, one line each (Ctrl-C ends it)."""
    cfg = config_or_fail(data_dir, config)

    async def main() -> None:
        spec = svc.sink_of(cfg, sink)
        async for event in svc.tail(spec, from_start=from_start):
            if as_json:  # JSON Lines: one object per event, as it arrives
                typer.echo(
                    json.dumps(
                        {
                            "event_id": event.event_id,
                            "subject": event.subject,
                            "body": dict(event.body),
                        },
                        sort_keys=True,
                        separators=(",", ":"),
                        default=str,
                    )
                )
            else:
                typer.echo(svc.line(event))

    try:
        anyio.run(main)
    except KeyboardInterrupt:
        return
    except CorralError as err:
        fail(err)
    except Exception as err:  # the broker refused or is away: one line, not a traceback
        fail(CorralError(f"cannot follow the sink: {err or type(err).__name__}"))
