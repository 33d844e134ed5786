"""`corral epic run|status|show|cancel`: epics run as waves of fresh agents by the engine
(services/epics.py, services/waves.py; docs/how-to/epics.md). With `--url`, status, show and
cancel ask the remote engine's API for the token's tenant's epics and print the same; `run`
names a file and a repository on this machine, so it stays local."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.domain.epics import EpicState
from corral.domain.errors import InvalidRequest
from corral.runtime.watch import engine_serving
from corral.schemas.epics import Epic, EpicShow
from corral.services import epics

from .edge import config_or_fail, emit, remote_url, through_api, waker, with_store
from .exits import fail
from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, new_table

if TYPE_CHECKING:
    from corral.client import AsyncClient

app = typer.Typer(
    no_args_is_help=True,
    help="Epics: tasks with dependencies run by the engine as waves of fresh agents, each try "
    "checked and judged by a council; Corral commits what passed onto the epic's branch.",
)

EpicArg = Annotated[str, typer.Argument(help="An epic (id, or a unique prefix).")]


@app.command("run")
def run_cmd(
    file: Annotated[Path, typer.Argument(help="The epic file (YAML): see docs/how-to/epics.md.")],
    repo: Annotated[
        Path,
        typer.Option("--repo", help="The target git repository (default: the current one)."),
    ] = Path(),
    base: Annotated[
        str | None,
        typer.Option("--base", help="The commit the epic branch starts from (default: HEAD)."),
    ] = None,
    tenant: Annotated[str, typer.Option("--tenant", help="Whose jobs the waves run.")] = "default",
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until the epic ends and show it.")
    ] = False,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Start an epic: check the file (a bad key is named by its path), make its branch in the
    target repository, and hand it to the engine. Each wave runs one fresh agent job per
    unblocked task in its own git worktree; a try passes when its checks pass and the council
    does not FAIL; Corral commits passing work onto the branch in task order. A failed try is
    retried up to the task's max_attempts (3 consecutive failures end its tries); then its
    on_exhausted steps (re-decomposed by an agent, or handed to a human), else it is struck;
    at most max_waves waves. Needs a running engine (`corral serve`). With --wait, exits 1 unless
    every task passed."""
    if (url := remote_url()) is not None:  # the file and the repository are this machine's
        from . import remote

        fail(remote.local_only("`corral epic run`", url))
    try:
        text = file.read_text()
    except OSError as err:
        fail(InvalidRequest(f"cannot read the epic file {file}: {err.strerror}"))
    cfg = config_or_fail(data_dir, config)
    epic = with_store(
        cfg,
        lambda st: epics.start(st, cfg, text, repo=repo, base=base, tenant=tenant, wake=waker(cfg)),
    )
    serving = with_store(cfg, lambda st: engine_serving(cfg, st, time.time()))
    if not serving and not as_json:
        typer.echo(
            f"corral: no engine is serving {cfg.data_dir}: the epic's first wave starts when "
            "`corral serve` runs there",
            err=True,
        )
    if wait:
        epic_id = epic.id
        while not epic.state.terminal:
            time.sleep(cfg.settings.scheduler.poll_interval_s)
            epic = with_store(cfg, lambda st: st.get_epic(epic_id))
        _show(cfg, epic_id, as_json)
        if epic.state is not EpicState.DONE:
            raise typer.Exit(1)  # a script sees an epic that did not pass every task
        return
    if as_json:
        d = with_store(cfg, lambda st: epics.detail(st, epic.id))
        emit(Epic.of(d.epic, d.tasks).dump())
        return
    typer.echo(epic.id)
    typer.echo(f"epic {epic.name} started on branch {epic.branch} of {epic.repo}", err=True)


@app.command("status")
def status_cmd(
    epic: Annotated[str | None, typer.Argument(help="One epic; without it, every epic.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Epics with their state, wave and tasks' states (one epic: its tasks)."""
    found = through_api(lambda c: _remote_status(c, epic))
    if found is None:
        cfg = config_or_fail(data_dir, config)
        if epic is not None:
            d = with_store(cfg, lambda st: epics.detail(st, epic))
            found = [Epic.of(d.epic, d.tasks).dump()]
        else:
            found = [Epic.of(d.epic, d.tasks).dump() for d in with_store(cfg, epics.listing)]
    if as_json:
        emit(found if epic is None else found[0])
        return
    if not found:
        console.print("no epics: `corral epic run FILE` starts one")
        return
    table = new_table(title="epics")
    for col in ("id", "name", "state", "wave", "tasks", "branch"):
        table.add_column(col)
    for e in found:
        counts: dict[str, int] = {}
        for t in e["tasks"]:
            counts[t["state"]] = counts.get(t["state"], 0) + 1
        tasks = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        wave = f"{e['wave']}/{e['max_waves']}"
        table.add_row(*(_plain(v) for v in (e["id"], e["name"], e["state"], wave, tasks)),
                      _plain(e["branch"]))  # fmt: skip
    console.print(table)


async def _remote_status(c: AsyncClient, epic: str | None) -> list[dict[str, Any]]:
    if epic is not None:  # the fields of `status` (an epic and its tasks), not `show`'s waves
        shown = (await c.epic(epic)).dump()
        return [Epic.model_validate(shown).dump()]
    return [e.dump() for e in await c.epics()]


@app.command("show")
def show_cmd(
    epic: EpicArg, as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """One epic in full: each task's tries, failures, commit and last verdict (checks, the
    council's consensus and each judge's verdict), and every wave's checkpoint."""
    shown = through_api(lambda c: c.epic(epic))
    if shown is not None:
        _print_show(shown.dump(), as_json)
        return
    _show(config_or_fail(data_dir, config), epic, as_json)


@app.command("cancel")
def cancel_cmd(
    epic: EpicArg,
    reason: Annotated[str, typer.Option("--reason", help="Recorded on the epic.")] = (
        "cancelled by operator"
    ),
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Stop an epic: the engine cancels its live jobs and ends it; what passed stays committed
    on its branch."""
    remote = through_api(lambda c: c.cancel_epic(epic, reason))
    if remote is not None:
        if as_json:
            emit(remote.dump())
        else:
            typer.echo(f"{remote.id} cancel requested; the engine stops it")
        return
    cfg = config_or_fail(data_dir, config)
    got = with_store(cfg, lambda st: epics.cancel(st, epic, reason=reason, wake=waker(cfg)))
    if as_json:
        d = with_store(cfg, lambda st: epics.detail(st, got.id))
        emit(Epic.of(d.epic, d.tasks).dump())
        return
    typer.echo(f"{got.id} cancel requested; the engine stops it")


def _show(cfg: Any, ref: str, as_json: bool) -> None:
    d = with_store(cfg, lambda st: epics.detail(st, ref))
    _print_show(EpicShow.full(d.epic, d.tasks, d.waves).dump(), as_json)


def _print_show(shown: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(shown)
        return
    e = shown
    console.print(_plain(f"epic {e['id']} {e['name']}: {e['state']}, wave {e['wave']}/"
                         f"{e['max_waves']}, branch {e['branch']} of {e['repo']}"))  # fmt: skip
    if e["reason"]:
        console.print(_plain(f"  {e['reason']}"))
    table = new_table(title="tasks")
    for col in ("task", "state", "tries", "failures", "commit", "last verdict"):
        table.add_column(col)
    for t in e["tasks"]:
        v = t["verdict"] or {}
        said = " ".join(
            str(x) for x in (v.get("gate"), v.get("council"), v.get("why")) if x is not None
        )
        if t["state"] == "escalated" and v.get("escalation"):
            said += f" [escalated: {v['escalation']}]"
        if v.get("replaced_by"):
            said += f" [replaced by {', '.join(map(str, v['replaced_by']))}]"
        table.add_row(
            _plain(t["id"]),
            _plain(t["state"]),
            str(t["attempts"]),
            str(t["failures"]),
            _plain((t["commit"] or "-")[:12]),
            _plain(said or "-"),
        )
    console.print(table)
    for w in e["waves"]:
        results = w["results"] or {k: "running" for k in w["tasks"]}
        line = ", ".join(f"{k} {v}" for k, v in results.items())
        console.print(_plain(f"wave {w['wave']}: {line}"))


def _plain(value: str) -> Any:
    """A value shown as written (a task id, a judge's words are never read as markup)."""
    from rich.text import Text

    return Text(value)
