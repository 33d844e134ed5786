"""Governance from the command line: `corral report`, `incidents`, `runs`, `audit verify`,
`kill-switch on|off|status`, `pause`, `resume`, `approvals list|approve|deny`. The records and
controls are the services' (services/queries.py, services/controls.py,
services/approvals.py); these commands parse, call one and render."""

from __future__ import annotations

import dataclasses
import getpass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral.domain.governance import Approval, ApprovalState, Incident, KillSwitch, ScopeKind
from corral.domain.ids import resolve
from corral.runtime.control import operator_only
from corral.services import approvals as approval_desk
from corral.services import audit as audit_desk
from corral.services import controls, queries
from corral.services.controls import scope_of

from .edge import config_or_fail as config_of
from .edge import emit, remote_url, waker, with_store
from .options import ConfigOpt, DataDir, JsonOpt

if TYPE_CHECKING:
    from corral.client import AsyncClient
    from corral.schemas.views import View
from .views import console, id_column, new_table, record_json, short_time, ts


def register(app: typer.Typer) -> None:
    """Add the governance commands to the `corral` app."""
    _register_report(app)
    _register_lists(app)
    _register_audit(app)
    _register_switches(app)
    _register_pause(app)
    _register_approvals(app)


def _register_report(app: typer.Typer) -> None:
    @app.command()
    def report(
        job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """A job's run report: written once when the job ended, never changed."""
        cfg = config_of(data_dir, config)
        view = with_store(cfg, lambda st: queries.report(st, job))
        j, r, incidents = view.job, view.report, view.incidents
        if r is None:
            why = view.missing_because()
            if as_json:
                emit({"job": j.id, "report": None, "reason": why})
                return
            typer.echo(f"job {j.id} has no run report yet: {why}")
            raise typer.Exit(1)
        if as_json:
            emit({**record_json(r), "incidents": [record_json(i) for i in incidents]})
            return
        console.print(f"[bold]run report {r.id}[/bold]  job {r.job_id}  {r.outcome.value}")
        for name, value in (
            ("role", r.role),
            ("tenant", r.tenant),
            ("workflow", r.workflow),
            ("attempts", r.attempts),
            ("tool calls", r.tool_calls),
            ("tokens in/out", f"{r.tokens_in} / {r.tokens_out}"),
            ("cost", f"${r.cost_usd:.4f}"),
            ("duration", f"{r.duration_ms} ms" if r.duration_ms else "-"),
            ("ended", ts(r.ended_at)),
            ("summary", r.summary),
            ("hash", r.hash),
        ):
            if value not in (None, ""):
                console.print(f"  {name:<14} {value}", markup=False, highlight=False)
        _print_incidents(incidents)


def _register_lists(app: typer.Typer) -> None:
    @app.command()
    def incidents(
        job: Annotated[
            str | None, typer.Argument(help="Only this job's (id, or a unique prefix or suffix).")
        ] = None,
        open_only: Annotated[
            bool, typer.Option("--open", help="Only incidents without a resolution.")
        ] = False,
        limit: Annotated[int, typer.Option("--limit")] = 100,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Incidents attached to run reports (append-only; a resolution is a new record)."""
        cfg = config_of(data_dir, config)
        found = with_store(
            cfg,
            lambda st: queries.incidents(
                st, job=job, open_only=open_only, limit=limit, short=not as_json
            ),
        )
        if as_json:
            emit([record_json(i) for i in found.incidents])
            return
        _print_incidents(found.incidents, empty="no incidents", short=found.short)

    @app.command()
    def runs(
        state: Annotated[str | None, typer.Option("--state", help="Only this job state.")] = None,
        limit: Annotated[int, typer.Option("--limit")] = 50,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """The unified read model (`v_run_unified`): jobs with their report, incident counts
        and latest policy verdict, newest first."""
        cfg = config_of(data_dir, config)
        found = with_store(
            cfg, lambda st: queries.runs(st, limit=limit, state=state, short=not as_json)
        )
        if as_json:
            emit([dataclasses.asdict(r) for r in found.runs])
            return
        rows, short = found.runs, found.short
        table = new_table()
        id_column(table, "job", list(short.values()))
        for col in ("state", "role", "outcome", "cost", "incidents", "last verdict"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                short.get(r.job_id, r.job_id),
                r.state,
                r.role,
                r.outcome or "-",
                f"${r.cost_usd:.4f}" if r.cost_usd is not None else "-",
                f"{r.incidents_open}/{r.incidents_total}" if r.incidents_total else "-",
                f"{r.policy_verdict} {r.policy_reason}" if r.policy_verdict else "-",
            )
        console.print(table)


def _register_audit(app: typer.Typer) -> None:
    audit = typer.Typer(
        no_args_is_help=True,
        help="The append-only records, hash-chained under a"
        " key kept outside the database, and their signed checkpoints.",
    )
    app.add_typer(audit, name="audit")

    @audit.command("verify")
    def audit_verify(
        as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
    ) -> None:
        """Check every audit chain (policy evaluations, reports, incidents, switches, budgets,
        approvals, job timelines) against the audit key and the signed checkpoints in the data
        directory, and that every append-only trigger is in place; exit 1 and say exactly what
        was changed or removed."""
        cfg = config_of(data_dir, config)
        result = with_store(cfg, lambda st: audit_desk.verify(st, cfg))
        if as_json:
            emit(dataclasses.asdict(result))
        elif result.ok:
            extra = (
                f", {result.prechain} older job events before the chain"
                if (result.prechain)
                else ""
            )
            if result.archived or result.archives_missing:
                extra += f", {result.archived} archived records intact"
            if result.archives_missing:
                extra += f" ({result.archives_missing} archive files not found, not checked)"
            typer.echo(
                f"audit ok: {result.checked} records, every chain intact, "
                f"{result.checkpoints} checkpoints matched{extra}"
            )
        else:
            typer.echo(
                f"audit FAILED: {len(result.problems)} problem(s) in {result.checked} records",
                err=True,
            )
            for table, row, why in result.problems[:20]:
                typer.echo(f"  {_where(table, row)}: {why}", err=True)
            if len(result.problems) > 20:
                typer.echo(
                    f"  … and {len(result.problems) - 20} more (--json lists them all)", err=True
                )
        if not result.ok:
            raise typer.Exit(1)

    _register_restore(audit)


def _register_restore(audit: typer.Typer) -> None:
    @audit.command("restore-triggers")
    def restore_triggers(data_dir: DataDir = None, config: ConfigOpt = None) -> None:
        """Put back the append-only triggers that are missing or disabled (an engine refuses to
        serve without them). History changed meanwhile stays visible to `corral audit
        verify`."""
        cfg = config_of(data_dir, config)
        restored = with_store(cfg, audit_desk.restore_triggers)
        typer.echo(
            f"restored {len(restored)} trigger(s): {', '.join(restored)}"
            if restored
            else "every append-only trigger is in place"
        )


def _where(table: str, row: str) -> str:
    if table == "checkpoints":
        return f"checkpoint file {row}"
    if table == "triggers":
        return f"trigger {row}"
    return f"{table} row {row}"


def _print_incidents(
    items: list[Incident], empty: str = "", short: dict[str, str] | None = None
) -> None:
    """Incidents as a table; `short`: the short forms of their jobs' ids (Store.short_ids)."""
    if not items:
        if empty:
            console.print(empty)
        return
    jobs = [(short or {}).get(i.job_id, i.job_id) for i in items]
    table = new_table(title="incidents")
    id_column(table, "id", [i.id for i in items])
    table.add_column("at", no_wrap=True)
    id_column(table, "job", jobs)
    for col in ("type", "severity", "message"):
        table.add_column(col, overflow="fold")
    for i, job in zip(items, jobs, strict=True):
        message = i.message if i.resolves is None else f"resolves {i.resolves}: {i.message}"
        table.add_row(i.id, short_time(i.created_at), job, i.type.value, i.severity.value, message)
    console.print(table)


ScopeOpt = Annotated[ScopeKind, typer.Option("--scope", help="What it applies to.")]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="The tenant, role or job (id, or a unique prefix or suffix); not for --scope global.",
    ),
]


def _register_switches(app: typer.Typer) -> None:
    ks = typer.Typer(
        no_args_is_help=True,
        help="Deny new runs in a scope and stop the running ones (KILLED) within a second.",
    )
    app.add_typer(ks, name="kill-switch")

    @ks.command("on")
    def kill_on(
        reason: Annotated[str, typer.Option("--reason", help="Recorded with it.")],
        scope: ScopeOpt = ScopeKind.GLOBAL,
        target: TargetOpt = None,
        expires_in: Annotated[
            float | None, typer.Option("--expires-in", help="Seconds until it lifts by itself.")
        ] = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Activate a kill switch."""
        controls.check_expiry(expires_in)  # a one-line error (exit 2) from main()
        if (url := remote_url()) is not None:
            from . import remote  # with its client: only when a URL is given

            switch = remote.record(
                KillSwitch,
                remote.run(url, lambda c: _engage_remote(c, reason, scope, target, expires_in)),
            )
        else:
            cfg = config_of(data_dir, config)
            operator_only(cfg.data_dir, "kill-switch on")
            switch = with_store(
                cfg,
                lambda st: controls.kill_switch_on(
                    st,
                    scope=scope,
                    target=target,
                    reason=reason,
                    expires_in=expires_in,
                    by=getpass.getuser(),
                    wake=waker(cfg),
                ),
            )
        if as_json:
            emit(record_json(switch))
        else:
            typer.echo(
                f"kill switch {switch.id} on ({scope_of(switch)}): new runs are denied, "
                "running ones stopped"
            )

    @ks.command("off")
    def kill_off(
        switch_id: Annotated[
            str | None,
            typer.Argument(
                help="The switch: its id or a unique prefix or suffix (default: every "
                "active one in --scope/--target)."
            ),
        ] = None,
        scope: ScopeOpt = ScopeKind.GLOBAL,
        target: TargetOpt = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Lift kill switches (recorded as a new event; the activation stays on record)."""
        if (url := remote_url()) is not None:
            from . import remote  # with its client: only when a URL is given

            lifted = remote.run(url, lambda c: _lift_remote(c, switch_id, scope, target))
        else:
            cfg = config_of(data_dir, config)
            operator_only(cfg.data_dir, "kill-switch off")
            lifted = with_store(
                cfg,
                lambda st: controls.kill_switch_off(
                    st,
                    switch_id=switch_id,
                    scope=scope,
                    target=target,
                    by=getpass.getuser(),
                    wake=waker(cfg),
                ),
            )
        if as_json:
            emit([record_json(s) for s in lifted])
            return
        if not lifted:
            typer.echo("no active kill switch: nothing to lift")
            return
        typer.echo(
            f"lifted {len(lifted)} kill switch(es)"
            + "".join(f"\n  {s.id} ({scope_of(s)})" for s in lifted)
        )

    _register_switch_status(ks)


def _register_switch_status(ks: typer.Typer) -> None:
    @ks.command("status")
    def kill_status(
        as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
    ) -> None:
        """Active kill switches."""
        if (url := remote_url()) is not None:
            from . import remote  # with its client: only when a URL is given

            active = [remote.record(KillSwitch, v) for v in remote.run(url, _switches)]
        else:
            active = with_store(config_of(data_dir, config), controls.kill_switches)
        if as_json:
            emit([record_json(s) for s in active])
            return
        if not active:
            typer.echo("no active kill switch")
        for s in active:
            until = f", until {ts(s.expires_at)}" if s.expires_at else ""
            typer.echo(
                f"{s.id}  {scope_of(s)}  since {ts(s.created_at)}{until}  by "
                f"{s.created_by}: {s.reason}"
            )


def _register_pause(app: typer.Typer) -> None:
    @app.command()
    def pause(
        reason: Annotated[str, typer.Option("--reason", help="Recorded with it.")],
        scope: ScopeOpt = ScopeKind.GLOBAL,
        target: TargetOpt = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Stop dispatching new runs in a scope; running attempts finish."""
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "pause")
        p = with_store(
            cfg,
            lambda st: controls.pause(
                st, scope=scope, target=target, reason=reason, by=getpass.getuser(), wake=waker(cfg)
            ),
        )
        if as_json:
            emit(record_json(p))
            return
        typer.echo(f"paused ({scope_of(p)}): {p.id}; queued jobs wait, running ones finish")

    @app.command()
    def resume(
        scope: ScopeOpt = ScopeKind.GLOBAL,
        target: TargetOpt = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Lift the pauses of a scope."""
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "resume")
        lifted = with_store(
            cfg,
            lambda st: controls.resume(
                st, scope=scope, target=target, by=getpass.getuser(), wake=waker(cfg)
            ),
        )
        if as_json:
            emit([record_json(p) for p in lifted])
            return
        typer.echo(f"resumed: {len(lifted)} pause(s) lifted")


def _register_approvals(app: typer.Typer) -> None:
    approvals = typer.Typer(
        no_args_is_help=True,
        help="Actions waiting for a human: a job, or "
        "one exact tool call a guardrail sent for approval.",
    )
    app.add_typer(approvals, name="approvals")

    @approvals.command("list")
    def approvals_list(
        state: Annotated[
            str | None,
            typer.Option(
                "--state", help="pending | approved | denied | expired (default: pending)"
            ),
        ] = "pending",
        job: Annotated[str | None, typer.Option("--job")] = None,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Approvals, oldest first."""
        if (url := remote_url()) is not None:
            from . import remote  # with its client: only when a URL is given

            got = remote.run(url, lambda c: c.approvals(state))
            found = [remote.record(Approval, v) for v in got]
            found = [a for a in found if job is None or job in (a.job_id,)]
        else:
            cfg = config_of(data_dir, config)
            found = with_store(
                cfg, lambda st: approval_desk.list_approvals(st, state=state, job=job)
            )
        if as_json:
            emit([record_json(a) for a in found])
            return
        if not found:
            typer.echo("no approvals")
        for a in found:
            typer.echo(
                f"{a.id}  {a.state.value:<8} job {a.job_id}  {a.reason}  "
                f"expires {ts(a.expires_at)}\n    {a.subject}"
            )

    def decide(
        approval_id: str,
        state: ApprovalState,
        note: str,
        as_json: bool,
        data_dir: Path | None,
        config: Path | None,
    ) -> None:
        if (url := remote_url()) is not None:
            from . import remote  # with its client: only when a URL is given

            approve = state is ApprovalState.APPROVED
            a = remote.record(
                Approval,
                remote.run(
                    url,
                    lambda c: (c.approve if approve else c.deny)(approval_id, note),
                ),
            )
            if as_json:
                emit(record_json(a))
            else:
                typer.echo(f"{a.id} {a.state.value}: {a.subject}")
            return
        cfg = config_of(data_dir, config)
        operator_only(
            cfg.data_dir,
            "approvals approve" if state is ApprovalState.APPROVED else "approvals deny",
        )
        a = with_store(
            cfg,
            lambda st: approval_desk.decide(
                st,
                cfg,
                approval_id,
                approve=state is ApprovalState.APPROVED,
                by=getpass.getuser(),
                wake=waker(cfg),
                note=note,
            ),
        )
        if as_json:
            emit(record_json(a))
            return
        typer.echo(f"{a.id} {a.state.value}: {a.subject}")

    @approvals.command("approve")
    def approvals_approve(
        approval_id: Annotated[str, typer.Argument(help="The approval id.")],
        note: Annotated[str, typer.Option("--note")] = "",
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Approve exactly the action the request names (its command, for a tool call)."""
        decide(approval_id, ApprovalState.APPROVED, note, as_json, data_dir, config)

    @approvals.command("deny")
    def approvals_deny(
        approval_id: Annotated[str, typer.Argument(help="The approval id.")],
        note: Annotated[str, typer.Option("--note")] = "",
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Refuse it (for good: the agent's later tries are refused too)."""
        decide(approval_id, ApprovalState.DENIED, note, as_json, data_dir, config)


async def _switches(c: AsyncClient) -> list[View]:
    return await c.kill_switches()


async def _remote_target(c: AsyncClient, scope: ScopeKind, target: str | None) -> str | None:
    """A `--target` over HTTP as locally: a job (`--scope job`) by its whole id or a unique
    prefix or suffix of the token's tenant's jobs; any other target as given."""
    if scope is ScopeKind.JOB and target:
        return await c.resolve(target)
    return target


async def _engage_remote(
    c: AsyncClient, reason: str, scope: ScopeKind, target: str | None, expires_in: float | None
) -> View:
    """`kill-switch on` over HTTP."""
    return await c.engage_kill_switch(
        reason,
        scope=scope.value,
        target=await _remote_target(c, scope, target),
        expires_in_s=expires_in,
    )


async def _lift_remote(
    c: AsyncClient, switch_id: str | None, scope: ScopeKind, target: str | None
) -> list[KillSwitch]:
    """`kill-switch off` over HTTP: the one named, else every active one of the scope."""
    from . import remote

    active = [remote.record(KillSwitch, v) for v in await c.kill_switches()]
    if switch_id is not None:  # as locally: its id, or a unique prefix or suffix
        chosen_id = resolve(switch_id, [s.id for s in active], "active kill switch")
        return [remote.record(KillSwitch, await c.lift_kill_switch(chosen_id))]
    target = await _remote_target(c, scope, target)
    chosen = [s for s in active if s.scope is scope and (target is None or s.target == target)]
    return [remote.record(KillSwitch, await c.lift_kill_switch(s.id)) for s in chosen]
