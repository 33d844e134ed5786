"""`corral breakers`, `corral escalations`, `corral status`: the core's live mechanism state,
asked of the running engine through its control socket (services/engine.py)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.services import engine

from .edge import config_or_fail, with_store
from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, id_column, new_table


def cleared_text(escalation: str, core: dict[str, Any] | None) -> str:
    """What clearing an escalation did, in one line; for a core crash loop, whether the core is
    back or what to do next."""
    text = f"escalation {escalation} cleared"
    if core is None:
        return text
    if core.get("connected"):
        return (
            f"{text}; the core is running again (pid {core.get('pid')}, a fresh budget of "
            f"{core.get('restart_budget')} restarts)"
        )
    return (
        f"{text}; the core was started again (pid {core.get('pid')}) but has not answered "
        "yet: watch `corral status`, and the engine's log if it crashes again"
    )


def _t(at: float | None) -> str:
    return "-" if not at else dt.datetime.fromtimestamp(at).strftime("%H:%M:%S")


def breaker_since(b: dict[str, Any]) -> float | None:
    """When a breaker entered its state: its last transition (an OPEN one: when it opened)."""
    history = b.get("history") or []
    if history and history[-1].get("to") == b.get("state"):
        return float(history[-1]["at"])
    return b.get("opened_at") if b.get("state") == "OPEN" else None


def print_breakers(snapshot: dict[str, Any]) -> None:
    breakers = snapshot.get("breakers") or []
    if not breakers:
        console.print("no breaker has seen a result yet (all CLOSED)")
        return
    table = new_table()
    id_column(table, "breaker", [str(b.get("name", "?")) for b in breakers])
    for col in ("state", "since", "probe at", "calls", "failures", "rate", "reason"):
        table.add_column(col, no_wrap=col != "reason", overflow="fold")
    at = snapshot.get("at")
    for b in breakers:
        after = b.get("retry_after_s")
        probe = at + after if at is not None and after is not None else None
        table.add_row(
            b.get("name", "?"),
            b.get("state", "?"),
            _t(breaker_since(b)),
            _t(probe),
            str(b.get("calls", "")),
            str(b.get("failures", "")),
            f"{b.get('failure_rate', 0):.2f}" if "failure_rate" in b else "",
            str(b.get("reason") or ""),
        )
    console.print(table)
    for b in breakers:
        for h in b.get("history") or []:
            console.print(
                f"  {_t(h.get('at'))}  {b.get('name')}: {h.get('from', '?')} → "
                f"{h.get('to', h.get('state', '?'))}  {h.get('reason', '')}",
                markup=False,
            )


def print_escalations(items: list[dict[str, Any]]) -> None:
    if not items:
        console.print("no active escalations")
        return
    table = new_table()
    id_column(table, "id", [e["id"] for e in items])
    for col in ("scope", "target", "reason", "severity", "action", "opened", "message"):
        table.add_column(col, overflow="fold" if col == "message" else "ellipsis")
    for e in items:
        table.add_row(
            e["id"],
            e["scope"],
            e["target"],
            e["reason"],
            e.get("severity", ""),
            e.get("action", ""),
            _t(e.get("opened_at")),
            e.get("message", ""),
        )
    console.print(table)


def _say(as_json: bool, data: dict[str, Any], text: str) -> None:
    """An action's outcome: JSON for scripts, a line for people."""
    typer.echo(json.dumps(data) if as_json else text)


def _clear(data_dir: Path, escalation: str, as_json: bool) -> None:
    cleared, core = engine.clear_escalation(data_dir, escalation)
    data: dict[str, Any] = {"escalation": cleared, "cleared": True}
    if core is not None:  # a core crash loop: whether the core is back
        data["core"] = core
    _say(as_json, data, cleared_text(str(cleared), core))


def _print_store(store: dict[str, Any]) -> None:
    """The store's health as the engine sees it (scheduler/outage.py)."""
    if store.get("degraded"):
        since = time.strftime("%H:%M:%S", time.localtime(float(store.get("since") or 0)))
        console.print(
            f"store DEGRADED since {since} ({store.get('failed_tries')} failed "
            f"tries): {store.get('error')}; running attempts keep running, "
            "writes are retried",
            markup=False,
        )
    elif store:
        console.print(f"store ok ({store.get('outages')} outages ridden out)", markup=False)


def _print_events(sinks: list[dict[str, Any]]) -> None:
    """Each event sink: published, behind by, skipped by the overflow rule (trace/drain.py)."""
    for sink in sinks:
        backlog = sink.get("backlog")
        failing = sink.get("failing_rounds") or 0
        console.print(
            f"events sink {sink.get('sink')} ({sink.get('kind')}): published "
            f"{sink.get('published')}, backlog "
            f"{'unknown' if backlog is None else backlog}, skipped "
            f"{sink.get('skipped')}"
            + (f", FAILING ({failing} rounds in a row)" if failing else ""),
            markup=False,
        )


def register(app: typer.Typer, resolve: Callable[[Path | None], Path]) -> None:
    """Add the mechanism commands to the `corral` app."""
    breakers = typer.Typer(
        help="Circuit breakers per worker kind and provider: state, history, operator reset.",
        invoke_without_command=True,
    )
    escalations = typer.Typer(
        no_args_is_help=True, help="Escalations (FATAL conditions): list and clear."
    )
    app.add_typer(breakers, name="breakers")
    app.add_typer(escalations, name="escalations")

    @breakers.callback()
    def breakers_show(
        ctx: typer.Context, data_dir: DataDir = None, as_json: JsonOpt = False
    ) -> None:
        """Show every breaker's state and its recent transitions."""
        if ctx.invoked_subcommand is not None:
            return
        snap = engine.snapshot(resolve(data_dir))
        if as_json:
            typer.echo(json.dumps(snap.get("breakers", []), indent=2))
        else:
            print_breakers(snap)

    @breakers.command("reset")
    def breakers_reset(
        name: Annotated[
            str, typer.Argument(help="Breaker name: worker:KIND, provider:P, model:M, or a kind.")
        ],
        data_dir: DataDir = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Close a breaker by hand (recorded as an operator reset)."""
        engine.reset_breaker(resolve(data_dir), name)
        _say(as_json, {"breaker": name, "state": "CLOSED"}, f"breaker {name} reset to CLOSED")

    @escalations.command("list")
    def escalations_list(data_dir: DataDir = None, as_json: JsonOpt = False) -> None:
        """Active escalations, with their scope and the action they took."""
        items = engine.snapshot(resolve(data_dir)).get("escalations", [])
        if as_json:
            typer.echo(json.dumps(items, indent=2))
        else:
            print_escalations(items)

    @escalations.command("clear")
    def escalations_clear(
        escalation: Annotated[str, typer.Argument(help="Escalation id.")],
        data_dir: DataDir = None,
        as_json: JsonOpt = False,
    ) -> None:
        """End an escalation: its action (isolation, workspace lock, safe stop) is lifted."""
        _clear(resolve(data_dir), escalation, as_json)

    @app.command("status")
    def status(
        data_dir: DataDir = None, config: ConfigOpt = None, as_json: JsonOpt = False
    ) -> None:
        """The engine's live mechanism: permits, watchdog gauges and stage, budgets; and each
        Ray environment's cluster (nodes, CPUs and GPUs, its jobs by status), asked now."""
        from dataclasses import asdict

        from corral.services import clusters

        snap = engine.snapshot(resolve(data_dir))
        health = clusters.clusters(config_or_fail(data_dir, config))
        if as_json:
            typer.echo(json.dumps({**snap, "clusters": [asdict(h) for h in health]}, indent=2))
            return
        wd, core = snap.get("watchdog", {}), snap.get("core", {})
        if core.get("given_up"):
            console.print(
                f"core not running: restart budget spent after {core.get('restarts')} "
                "restarts (crash loop); no new work starts. `corral escalations "
                "clear <id>` starts it again with a fresh budget",
                markup=False,
            )
        else:
            console.print(
                f"core pid {core.get('pid')}  restarts {core.get('restarts')}  "
                f"permits live {snap.get('permits', {}).get('live')}  defense stage "
                f"{wd.get('stage_name')} ({wd.get('cause') or 'no cause'})"
            )
        _print_store(snap.get("store") or {})
        _print_events(snap.get("events") or [])
        for name, value in (wd.get("gauges") or {}).items():
            console.print(f"  {name:<28} {value:g}")
        print_escalations(snap.get("escalations", []))
        _print_clusters(health)


def _print_clusters(health: list[Any]) -> None:
    for h in health:
        if not h.reachable:
            console.print(f"ray {h.env} ({h.address}): unreachable: {h.error}", markup=False)
            continue
        jobs = ", ".join(f"{k} {v}" for k, v in h.jobs.items()) or "none"
        console.print(
            f"ray {h.env} ({h.address}): nodes {h.nodes_alive} alive, {h.nodes_dead} dead; "
            f"CPU {h.cpus_used:g}/{h.cpus_total:g}  GPU {h.gpus_used:g}/{h.gpus_total:g}; "
            f"jobs {jobs}",
            markup=False,
        )


def register_metrics(app: typer.Typer) -> None:
    """Add `corral metrics`."""

    @app.command("metrics")
    def metrics_cmd(data_dir: DataDir = None, config: ConfigOpt = None) -> None:
        """Prometheus metrics of the data directory, read now from the store and the engine's
        core (for a node exporter's textfile collector; the HTTP API serves them at /metrics)."""
        from corral.services import metrics  # prometheus_client: only for this command

        cfg = config_or_fail(data_dir, config)
        body = with_store(cfg, lambda store: metrics.exposition(store, cfg))
        typer.echo(body.decode(), nl=False)
