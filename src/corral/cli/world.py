"""`corral world`: the world model (services/world.py) — running agents, each environment's
slots and queue, who spawned and who waits for whom, and any deadlock among them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from corral.schemas import views
from corral.services import replay, world

from .edge import config_or_fail, emit, with_store
from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, new_table, short_time

app = typer.Typer(
    help="The world model: running agents, environments, execution topology, deadlocks.",
)


@app.callback(invoke_without_command=True)
def world_cmd(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """The fleet now: running agents (tool calls, current tool, session), each environment's
    jobs in flight against its cap and its queue, the edges spawned_by / blocked_by / waits_for
    / waits_for_slot, the causal graph, and any cycle of waits (a deadlock)."""
    if ctx.invoked_subcommand is not None:
        return
    cfg = config_or_fail(data_dir, config)
    snap = with_store(cfg, lambda st: world.snapshot(st, cfg.settings))
    shown = world.world_view(snap).dump()
    if as_json:
        emit(shown)
        return
    _print(shown, at=snap.at)


@app.command("baselines")
def baselines_cmd(
    as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """The anomaly detector's rolling baselines: per role, job kind (workflow, else worker
    kind) and metric, how many finished attempts it holds and their median. A live attempt
    past the role's `anomaly.factor` × a median of at least five is flagged."""
    cfg = config_or_fail(data_dir, config)
    found = [views.Baseline.of(b).dump() for b in with_store(cfg, world.baselines)]
    if as_json:
        emit(found)
        return
    if not found:
        console.print("no baselines yet: they fill as agent attempts finish")
        return
    table = new_table(title="baselines")
    for col in ("role", "kind", "metric", "samples", "median", "ready"):
        table.add_column(col)
    for b in found:
        median = "-" if b["median"] is None else f"{b['median']:g}"
        table.add_row(
            _plain(b["role"]),
            _plain(b["kind"]),
            b["metric"],
            str(b["samples"]),
            median,
            "yes" if b["ready"] else "no",
        )
    console.print(table)


def replay_cmd(
    job: Annotated[
        str,
        typer.Argument(
            help="A job (id, or a unique prefix or suffix), a Ray submission id or a W&B run id."
        ),
    ],
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """The control-plane chain behind a job (or behind the attempt a Ray submission id or a W&B
    run id names): its root intent, every job spawned below it, and
    each one's timeline, tool calls and policy evaluations in time order, with the audit chains
    verified (exit 1 when a record was changed or removed)."""
    cfg = config_or_fail(data_dir, config)
    found = with_store(cfg, lambda st: replay.replay(st, cfg, job))
    shown = replay.replay_view(found).dump()
    if as_json:
        emit(shown)
    else:
        out = console.print
        out(
            f"replay of {found.job.id}"
            + (f" (attempt {found.attempt})" if found.attempt is not None else "")
            + f": root intent {found.root.id}, {len(found.jobs)} jobs, "
            f"{len(found.steps)} steps" + (" (tree cut: too many jobs)" if found.cut else ""),
            markup=False,
            highlight=False,
        )
        for j in found.jobs:
            out(f"{'  ' * j.depth}{j.id} {j.role} {j.state.value}", markup=False, highlight=False)
        for s in found.steps:
            out(
                f"{short_time(s.at)} {s.job_id} {s.kind:<9} {s.subject}: {s.detail}",
                markup=False,
                highlight=False,
            )
        a = found.audit
        verdict = "audit ok" if a.ok else f"audit FAILED: {len(a.problems)} problem(s)"
        out(f"{verdict} ({a.checked} records checked)", markup=False, highlight=False)
    if not found.audit.ok:
        raise typer.Exit(1)


def _print(w: dict[str, Any], *, at: float) -> None:
    out = console.print
    out(f"world at {short_time(at)}", markup=False, highlight=False)
    if w["agents"]:
        table = new_table(title="agents")
        for col in ("job", "role", "status", "tool calls", "current tool", "session"):
            table.add_column(col, no_wrap=col in ("job", "status"))
        for job_id, a in w["agents"].items():
            table.add_row(
                *(
                    _plain(v)
                    for v in (
                        job_id,
                        a["role"],
                        a["status"],
                        str(a["tool_call_count"]),
                        a["current_tool"] or "-",
                        a["session_id"] or "-",
                    )
                )
            )
        out(table)
    else:
        out("no agents running")
    table = new_table(title="environments")
    for col in ("environment", "kind", "in flight", "queued", "cluster"):
        table.add_column(col)
    for name, e in w["user_plane"].items():
        table.add_row(
            _plain(name),
            e["kind"],
            f"{e['jobs_in_flight']}/{e['cap']}",
            str(e["queue_depth"]),
            _plain(e["cluster_status"] or "-"),
        )
    out(table)
    edges = w["execution_topology"]
    out(f"topology: {len(edges)} edges", markup=False, highlight=False)
    for e in edges:
        slot = f" ({e['slot']})" if e["slot"] else ""
        out(
            f"  {e['job_id']} {e['relationship']} {e['related_job_id']}{slot}",
            markup=False,
            highlight=False,
        )
    for d in w["deadlocks"]:
        out(f"DEADLOCK: {' → '.join(d['jobs'])}: {d['message']}", markup=False, highlight=False)


def _plain(value: str) -> Any:
    """A cell shown as written (a role, tool or session id is never read as markup)."""
    from rich.text import Text

    return Text(value)
