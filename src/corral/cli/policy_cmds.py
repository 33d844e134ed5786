"""Budgets, dark launches and the pre-run policy from the command line: `corral budget
set|status`, `corral dark-launch enable|disable|status`, `corral policy check|log|stats`.

The work is the services' (services/controls.py, services/policy.py, services/queries.py).
`policy check` runs the pure pre-run decision (policy/prerun.py) for a would-be job against the
store's current kill switches, pauses, budgets, the tenant's parallel limit and active runs, the
dark launch and the roles that require approval, and writes nothing. Its exit
status is the verdict: 0 allow, 1 deny, 8 require_approval, 9 pause (bad input: 2, as always).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.domain.errors import CorralError
from corral.domain.governance import BudgetCeiling, PrerunVerdict
from corral.runtime.control import operator_only
from corral.services import controls, queries
from corral.services import policy as policy_desk
from corral.services.controls import BudgetLine, LaunchStanding

from .edge import config_or_fail as config_of
from .edge import emit, waker, with_store
from .exits import fail
from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, evaluation_json, new_table, ts

# `policy check`'s exit status per verdict (docs/reference/cli.md; 2 stays "bad input").
CHECK_EXIT = {
    PrerunVerdict.ALLOW: 0,
    PrerunVerdict.DENY: 1,
    PrerunVerdict.REQUIRE_APPROVAL: 8,
    PrerunVerdict.PAUSE: 9,
}


def _local(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def register(app: typer.Typer) -> None:
    """Add `budget`, `dark-launch` and `policy` to the `corral` app."""
    budget = typer.Typer(
        no_args_is_help=True,
        help="USD ceilings per tenant or role and "
        "period, reserved before each attempt and committed at its cost.",
    )
    app.add_typer(budget, name="budget")
    _register_budget_set(budget)
    _register_budget_status(budget)
    launch = typer.Typer(
        no_args_is_help=True,
        help="Let only a fixed fraction of workflows "
        "run (md5 position < percentage, docs/reference/dark-launch.md).",
    )
    app.add_typer(launch, name="dark-launch")
    _register_dark_launch_set(launch)
    _register_dark_launch_status(launch)
    policy = typer.Typer(
        no_args_is_help=True,
        help="The pre-run policy: try it on a would-be "
        "job, and read the evaluations it (and the guardrails) recorded.",
    )
    app.add_typer(policy, name="policy")
    _register_policy_check(policy)
    _register_policy_log(policy)
    _register_policy_stats(policy)


# ---- budgets ----------------------------------------------------------------------------------


def _ceiling_json(c: BudgetCeiling) -> dict[str, Any]:
    return {
        "scope": c.scope.value,
        "target": c.target,
        "period": c.period.value,
        "ceiling_usd": c.ceiling_usd,
    }


def _line_json(line: BudgetLine) -> dict[str, Any]:
    """A ceiling with its period's start (and reset), spent, reserved and headroom."""
    return {
        **_ceiling_json(line.ceiling),
        "period_start": ts(line.period_start),
        "resets_at": ts(line.resets_at) if line.resets_at is not None else None,
        "spent_usd": line.spent_usd,
        "reserved_usd": line.reserved_usd,
        "headroom_usd": line.headroom_usd,
    }


def _register_budget_set(budget: typer.Typer) -> None:
    @budget.command("set")
    def budget_set(
        scope: Annotated[str, typer.Option("--scope", help="tenant or role.")],
        target: Annotated[str, typer.Option("--target", help="The tenant or role name.")],
        period: Annotated[
            str, typer.Option("--period", help="daily or monthly (UTC calendar), or rolling_30d.")
        ],
        ceiling_usd: Annotated[float, typer.Option("--ceiling-usd", help="USD per period.")],
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Set a ceiling (the latest per scope and target wins; earlier ones stay on record)."""
        try:
            ceiling = controls.budget_ceiling(
                scope=scope, target=target, period=period, ceiling_usd=ceiling_usd
            )
        except CorralError as err:
            fail(err)
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "budget set")
        previous, line = with_store(
            cfg, lambda st: controls.set_budget(st, ceiling, by=getpass.getuser(), wake=waker(cfg))
        )
        row = _line_json(line)
        if as_json:
            emit({**row, "previous": _ceiling_json(previous) if previous else None})
            return
        was = f" (was ${previous.ceiling_usd:.2f} {previous.period.value})" if previous else ""
        typer.echo(
            f"budget {ceiling.scope.value} {ceiling.target}: "
            f"${ceiling.ceiling_usd:.2f} {ceiling.period.value}{was}; "
            f"${row['spent_usd']:.2f} spent, ${row['headroom_usd']:.2f} left this period"
        )


def _register_budget_status(budget: typer.Typer) -> None:
    @budget.command("status")
    def budget_status(
        scope: Annotated[str | None, typer.Option("--scope", help="Only tenant or role.")] = None,
        target: Annotated[
            str | None, typer.Option("--target", help="Only this tenant/role.")
        ] = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Each ceiling in force: its period's start, spent, reserved and headroom."""
        try:
            kind = controls.budget_scope(scope) if scope else None
        except CorralError as err:
            fail(err)
        cfg = config_of(data_dir, config)
        rows = [
            _line_json(line)
            for line in with_store(cfg, lambda st: controls.budgets(st, scope=kind, target=target))
        ]
        if as_json:
            emit(rows)
            return
        if not rows:
            typer.echo("no budget ceiling" + (" matches" if scope or target else " is set"))
            return
        _print_budgets(rows)


def _print_budgets(rows: list[dict[str, Any]]) -> None:
    table = new_table(box=None)  # `--json` has the exact period start
    for col in (
        "scope",
        "target",
        "period",
        "since (UTC)",
        "ceiling",
        "spent",
        "reserved",
        "headroom",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["scope"],
            r["target"],
            r["period"],
            str(r["period_start"])[:10],
            f"${r['ceiling_usd']:.2f}",
            f"${r['spent_usd']:.2f}",
            f"${r['reserved_usd']:.2f}",
            f"${r['headroom_usd']:.2f}",
        )
    console.print(table)


# ---- dark launches ----------------------------------------------------------------------------


def _launch_json(s: LaunchStanding) -> dict[str, Any]:
    """The setting (if any) with the workflow's md5 position: does step 5 let it run?"""
    launch = s.setting
    return {
        "workflow": s.workflow,
        "set": launch is not None,
        "enabled": bool(launch and launch.enabled),
        "percentage": launch.percentage if launch else None,
        "position": s.position,
        "in_window": s.in_window,
        "runs": s.runs,
    }


def _launch_line(d: dict[str, Any]) -> str:
    if not d["set"]:
        return f"{d['workflow']}: no dark launch (its runs go through); position {d['position']}"
    where = "inside" if d["in_window"] else "outside"
    sign = "<" if d["in_window"] else "≥"
    window = f"position {d['position']} {sign} {d['percentage']}%: {where} the window"
    if not d["enabled"]:
        return f"{d['workflow']}: dark launch disabled (its runs go through); {window}"
    effect = "its runs go through" if d["runs"] else "its runs are denied (dark_launch_excluded)"
    return f"{d['workflow']}: dark launch at {d['percentage']}%; {window}: {effect}"


def _register_dark_launch_set(launch: typer.Typer) -> None:
    @launch.command("enable")
    def dark_launch_enable(
        workflow: Annotated[str, typer.Argument(help="The workflow id.")],
        percentage: Annotated[
            int,
            typer.Option("--percentage", help="0 … 100: workflows whose position is below it run."),
        ],
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Dark-launch a workflow: it runs only if its md5 position < PERCENTAGE."""
        try:
            controls.check_percentage(percentage)
        except CorralError as err:
            fail(err)
        _set_launch(data_dir, config, workflow, as_json, percentage=percentage, enabled=True)

    @launch.command("disable")
    def dark_launch_disable(
        workflow: Annotated[str, typer.Argument(help="The workflow id.")],
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """End a workflow's dark launch: all its runs go through (a new setting; the earlier
        ones stay on record)."""
        _set_launch(data_dir, config, workflow, as_json, percentage=None, enabled=False)


def _set_launch(
    data_dir: Path | None,
    config: Path | None,
    workflow: str,
    as_json: bool,
    *,
    percentage: int | None,
    enabled: bool,
) -> None:
    cfg = config_of(data_dir, config)
    try:
        controls.check_workflow(workflow)
    except CorralError as err:
        fail(err)
    operator_only(cfg.data_dir, "dark-launch enable" if enabled else "dark-launch disable")
    standing = with_store(
        cfg,
        lambda st: controls.set_dark_launch(
            st,
            workflow,
            percentage=percentage,
            enabled=enabled,
            by=getpass.getuser(),
            wake=waker(cfg),
        ),
    )
    data = _launch_json(standing)
    if as_json:
        emit(data)
    else:
        typer.echo(_launch_line(data))


def _register_dark_launch_status(launch: typer.Typer) -> None:
    @launch.command("status")
    def dark_launch_status(
        workflow: Annotated[
            str | None, typer.Argument(help="Only this workflow (shown even without a setting).")
        ] = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Dark launch settings (latest per workflow), each with the workflow's md5 position
        and whether it is inside the window."""
        cfg = config_of(data_dir, config)
        if workflow is not None:
            wf: str = workflow
            data = _launch_json(with_store(cfg, lambda st: controls.dark_launch(st, wf)))
            if as_json:
                emit(data)
            else:
                typer.echo(_launch_line(data))
            return
        rows = [_launch_json(d) for d in with_store(cfg, controls.dark_launches)]
        if as_json:
            emit(rows)
            return
        if not rows:
            typer.echo("no dark launch is set")
        for d in rows:
            typer.echo(_launch_line(d))


# ---- policy check -----------------------------------------------------------------------------


def _register_policy_check(policy: typer.Typer) -> None:
    @policy.command("check")
    def policy_check(
        role: Annotated[str, typer.Option("--role", "-r", help="The would-be job's role.")],
        tenant: Annotated[str, typer.Option("--tenant")] = "default",
        workflow: Annotated[
            str | None, typer.Option("--workflow", help="Its workflow (for the dark launch).")
        ] = None,
        estimate_usd: Annotated[
            float | None,
            typer.Option(
                "--estimate-usd",
                help="Its reservation (default: the role's cost_estimate_usd).",
                show_default=False,
            ),
        ] = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Would a job of ROLE be dispatched now? The pre-run verdict, its reason, the step that
        decided and the inputs it used; nothing is recorded.

        Exit status: 0 allow, 1 deny, 8 require_approval, 9 pause.
        """
        cfg = config_of(data_dir, config)
        d = with_store(
            cfg,
            lambda st: policy_desk.check(
                st, cfg, role=role, tenant=tenant, workflow=workflow, estimate_usd=estimate_usd
            ),
        )
        if as_json:
            emit(
                {
                    "verdict": d.verdict.value,
                    "reason": d.reason.value,
                    "step": d.step.value,
                    "message": d.message,
                    "snapshot": d.snapshot,
                }
            )
        else:
            typer.echo(f"{d.verdict.value}  reason={d.reason.value}  step={d.step.value}")
            typer.echo(f"  message:  {d.message}")
            snapshot = json.dumps(d.snapshot, indent=2, sort_keys=True, default=str)
            typer.echo("  snapshot: " + snapshot.replace("\n", "\n  "))
        raise typer.Exit(CHECK_EXIT[d.verdict])


# ---- policy log and stats ---------------------------------------------------------------------


SinceOpt = Annotated[
    float | None,
    typer.Option(
        "--since", help="Only the last SECONDS seconds.", metavar="SECONDS", show_default=False
    ),
]


def _register_policy_log(policy: typer.Typer) -> None:
    @policy.command("log")
    def policy_log(
        job: Annotated[
            str | None, typer.Option("--job", help="Only this job (id or prefix).")
        ] = None,
        stage: Annotated[
            str | None, typer.Option("--stage", help="pre_run, tool_call, spawn …")
        ] = None,
        verdict: Annotated[
            str | None, typer.Option("--verdict", help="allow, deny, pause or require_approval.")
        ] = None,
        limit: Annotated[int, typer.Option("--limit", "-n", help="The latest N.")] = 50,
        since: SinceOpt = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Policy evaluations (pre-run decisions and guardrail checks), oldest first."""
        try:
            f = queries.policy_filter(stage=stage, verdict=verdict, limit=limit, since_s=since)
        except CorralError as err:
            fail(err)
        cfg = config_of(data_dir, config)
        found = with_store(cfg, lambda st: queries.policy_log(st, f, job=job))
        if as_json:
            emit([evaluation_json(e) for e in found])
            return
        if not found:
            typer.echo("no policy evaluations")
            return
        _print_columns(
            ("time", "job", "attempt", "stage", "subject", "verdict", "reason", "message"),
            [
                (
                    _local(e.at),
                    e.job_id,
                    "-" if e.attempt is None else str(e.attempt),
                    e.stage,
                    e.subject,
                    e.verdict,
                    e.reason,
                    e.message,
                )
                for e in found
            ],
        )


def _print_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """One line per row, columns aligned, nothing cut (the last column is not padded)."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    for r in (header, *rows):
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)]
        typer.echo("  ".join((*cells, r[-1])).rstrip())


def _register_policy_stats(policy: typer.Typer) -> None:
    @policy.command("stats")
    def policy_stats(
        since: SinceOpt = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """How many evaluations ended how: counts by stage × verdict × reason."""
        try:
            f = queries.policy_filter(limit=1, since_s=since)
        except CorralError as err:
            fail(err)
        cfg = config_of(data_dir, config)
        stats = with_store(cfg, lambda st: queries.policy_stats(st, f))
        ordered = stats.counts
        rows = [{"stage": s, "verdict": v, "reason": r, "count": n} for (s, v, r), n in ordered]
        if as_json:
            emit(
                {
                    "since": ts(stats.since),
                    "total": stats.total,
                    "capped": stats.capped,
                    "counts": rows,
                }
            )
            return
        if not rows:
            typer.echo(
                "no policy evaluations" + (f" in the last {since:g}s" if since is not None else "")
            )
            return
        table = new_table()
        for col in ("stage", "verdict", "reason", "count"):
            table.add_column(col, no_wrap=True, justify="right" if col == "count" else "left")
        for (s, v, r), n in ordered:
            table.add_row(s, v, r, str(n))
        console.print(table)
        typer.echo(
            f"{stats.total} evaluation(s)"
            + (f" in the last {since:g}s" if since is not None else "")
        )
