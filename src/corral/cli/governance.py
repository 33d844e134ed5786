"""Governance records from the store: `corral report`, `corral incidents`, `corral runs`,
`corral audit verify`."""

from __future__ import annotations

import dataclasses
import getpass
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from corral.config import Config
from corral.core.ports import Store, UnifiedRun
from corral.domain import bounds
from corral.domain.errors import InvalidRequest
from corral.domain.governance import (
    Approval,
    ApprovalState,
    Incident,
    KillSwitch,
    Pause,
    ScopeKind,
)
from corral.domain.ids import new_id, resolve
from corral.runtime.assembly import submissions
from corral.runtime.audit import verify as verify_audit
from corral.runtime.control import operator_only, poke
from corral.runtime.published import active_config

from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, id_column, new_table, record_json, short_time, ts

T = TypeVar("T")
ConfigOf = Callable[[Path | None, Path | None], Config]
WithStore = Callable[[Config, Callable[[Store], Awaitable[Any]]], Any]
Emit = Callable[[Any], None]


def register(app: typer.Typer, config_of: ConfigOf, with_store: WithStore, emit: Emit) -> None:
    """Add the governance record commands to the `corral` app."""
    _register_report(app, config_of, with_store, emit)
    _register_lists(app, config_of, with_store, emit)
    _register_audit(app, config_of, with_store, emit)
    _register_switches(app, config_of, with_store, emit)
    _register_pause(app, config_of, with_store, emit)
    _register_approvals(app, config_of, with_store, emit)


def _register_report(app: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                     emit: Emit) -> None:
    @app.command()
    def report(job: Annotated[str, typer.Argument(help="Job id (or a unique prefix or suffix).")],
               as_json: JsonOpt = False, data_dir: DataDir = None,
               config: ConfigOpt = None) -> None:
        """A job's run report: written once when the job ended, never changed."""
        cfg = config_of(data_dir, config)

        async def fetch(st: Store) -> tuple[Any, Any, Any]:
            j = await st.get_job(job)
            return j, await st.report(j.id), await st.incidents(j.id)

        j, r, incidents = with_store(cfg, fetch)
        if r is None:
            why = ("it is still " + j.state.value if not j.state.terminal
                   else "it is written within a second of the end")
            if as_json:
                emit({"job": j.id, "report": None, "reason": why})
                return
            typer.echo(f"job {j.id} has no run report yet: {why}")
            raise typer.Exit(1)
        if as_json:
            emit({**record_json(r), "incidents": [record_json(i) for i in incidents]})
            return
        console.print(f"[bold]run report {r.id}[/bold]  job {r.job_id}  {r.outcome.value}")
        for name, value in (("role", r.role), ("tenant", r.tenant), ("workflow", r.workflow),
                            ("attempts", r.attempts), ("tool calls", r.tool_calls),
                            ("tokens in/out", f"{r.tokens_in} / {r.tokens_out}"),
                            ("cost", f"${r.cost_usd:.4f}"),
                            ("duration", f"{r.duration_ms} ms" if r.duration_ms else "-"),
                            ("ended", ts(r.ended_at)), ("summary", r.summary),
                            ("hash", r.hash)):
            if value not in (None, ""):
                console.print(f"  {name:<14} {value}", markup=False, highlight=False)
        _print_incidents(incidents)


def _register_lists(app: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                    emit: Emit) -> None:
    @app.command()
    def incidents(job: Annotated[str | None, typer.Argument(
                      help="Only this job's (id, or a unique prefix or suffix).")] = None,
                  open_only: Annotated[bool, typer.Option(
                      "--open", help="Only incidents without a resolution.")] = False,
                  limit: Annotated[int, typer.Option("--limit")] = 100,
                  as_json: JsonOpt = False, data_dir: DataDir = None,
                  config: ConfigOpt = None) -> None:
        """Incidents attached to run reports (append-only; a resolution is a new record)."""
        cfg = config_of(data_dir, config)

        async def fetch(st: Store) -> tuple[list[Incident], dict[str, str]]:
            job_id = (await st.get_job(job)).id if job else None
            found = await st.incidents(job_id, open_only=open_only, limit=limit)
            return found, await st.short_ids([i.job_id for i in found]) if not as_json else {}

        found, short = with_store(cfg, fetch)
        if as_json:
            emit([record_json(i) for i in found])
            return
        _print_incidents(found, empty="no incidents", short=short)

    @app.command()
    def runs(state: Annotated[str | None, typer.Option("--state", help="Only this job state.")]
             = None, limit: Annotated[int, typer.Option("--limit")] = 50,
             as_json: JsonOpt = False, data_dir: DataDir = None,
             config: ConfigOpt = None) -> None:
        """The unified read model (`v_run_unified`): jobs with their report, incident counts
        and latest policy verdict, newest first."""
        cfg = config_of(data_dir, config)
        if as_json:
            emit([dataclasses.asdict(r)
                  for r in with_store(cfg, lambda st: st.run_unified(limit, state=state))])
            return

        async def fetch(st: Store) -> tuple[list[UnifiedRun], dict[str, str]]:
            found = await st.run_unified(limit, state=state)
            return found, await st.short_ids([r.job_id for r in found])

        rows, short = with_store(cfg, fetch)
        table = new_table()
        id_column(table, "job", list(short.values()))
        for col in ("state", "role", "outcome", "cost", "incidents", "last verdict"):
            table.add_column(col)
        for r in rows:
            table.add_row(short.get(r.job_id, r.job_id), r.state, r.role, r.outcome or "-",
                          f"${r.cost_usd:.4f}" if r.cost_usd is not None else "-",
                          f"{r.incidents_open}/{r.incidents_total}" if r.incidents_total else "-",
                          f"{r.policy_verdict} {r.policy_reason}" if r.policy_verdict else "-")
        console.print(table)


def _register_audit(app: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                    emit: Emit) -> None:
    audit = typer.Typer(no_args_is_help=True, help="The append-only records, hash-chained under a"
                        " key kept outside the database, and their signed checkpoints.")
    app.add_typer(audit, name="audit")

    @audit.command("verify")
    def audit_verify(as_json: JsonOpt = False, data_dir: DataDir = None,
                     config: ConfigOpt = None) -> None:
        """Check every audit chain (policy evaluations, reports, incidents, switches, budgets,
        approvals, job timelines) against the audit key and the signed checkpoints in the data
        directory, and that every append-only trigger is in place; exit 1 and say exactly what
        was changed or removed."""
        cfg = config_of(data_dir, config)
        result = with_store(cfg, lambda st: verify_audit(st, cfg))
        if as_json:
            emit(dataclasses.asdict(result))
        elif result.ok:
            extra = f", {result.prechain} older job events before the chain" if (
                result.prechain) else ""
            typer.echo(f"audit ok: {result.checked} records, every chain intact, "
                       f"{result.checkpoints} checkpoints matched{extra}")
        else:
            typer.echo(f"audit FAILED: {len(result.problems)} problem(s) in {result.checked} "
                       "records", err=True)
            for table, row, why in result.problems[:20]:
                typer.echo(f"  {_where(table, row)}: {why}", err=True)
            if len(result.problems) > 20:
                typer.echo(f"  … and {len(result.problems) - 20} more (--json lists them all)",
                           err=True)
        if not result.ok:
            raise typer.Exit(1)

    _register_restore(audit, config_of, with_store)


def _register_restore(audit: typer.Typer, config_of: ConfigOf, with_store: WithStore) -> None:
    @audit.command("restore-triggers")
    def restore_triggers(data_dir: DataDir = None, config: ConfigOpt = None) -> None:
        """Put back the append-only triggers that are missing or disabled (an engine refuses to
        serve without them). History changed meanwhile stays visible to `corral audit
        verify`."""
        cfg = config_of(data_dir, config)
        restored = with_store(cfg, lambda st: st.restore_triggers())
        typer.echo(f"restored {len(restored)} trigger(s): {', '.join(restored)}" if restored
                   else "every append-only trigger is in place")


def _where(table: str, row: str) -> str:
    if table == "checkpoints":
        return f"checkpoint file {row}"
    if table == "triggers":
        return f"trigger {row}"
    return f"{table} row {row}"


def _print_incidents(items: list[Incident], empty: str = "",
                     short: dict[str, str] | None = None) -> None:
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
        table.add_row(i.id, short_time(i.created_at), job, i.type.value, i.severity.value,
                      message)
    console.print(table)


ScopeOpt = Annotated[ScopeKind, typer.Option("--scope", help="What it applies to.")]
TargetOpt = Annotated[str | None, typer.Option(
    "--target", help="The tenant, role or job (id, or a unique prefix or suffix); not for "
                     "--scope global.")]


async def _target(st: Store, scope: ScopeKind, target: str | None) -> str | None:
    if scope is ScopeKind.GLOBAL:
        if target:
            raise InvalidRequest("--scope global takes no --target")
        return None
    if not target:
        raise InvalidRequest(f"--scope {scope.value} needs --target")
    return (await st.get_job(target)).id if scope is ScopeKind.JOB else target


def _register_switches(app: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                       emit: Emit) -> None:
    ks = typer.Typer(no_args_is_help=True, help="Deny new runs in a scope and stop the running "
                     "ones (KILLED) within a second.")
    app.add_typer(ks, name="kill-switch")

    @ks.command("on")
    def kill_on(reason: Annotated[str, typer.Option("--reason", help="Recorded with it.")],
                scope: ScopeOpt = ScopeKind.GLOBAL, target: TargetOpt = None,
                expires_in: Annotated[float | None, typer.Option(
                    "--expires-in", help="Seconds until it lifts by itself.")] = None,
                as_json: JsonOpt = False, data_dir: DataDir = None,
                config: ConfigOpt = None) -> None:
        """Activate a kill switch."""
        if expires_in is not None:  # a one-line error (exit 2) from main()
            bounds.number("--expires-in", expires_in, low=0, high=bounds.MAX_EXPIRES_S,
                          low_open=True, unit="seconds")
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "kill-switch on")
        now = time.time()

        async def run(st: Store) -> KillSwitch:
            return await st.activate_kill_switch(KillSwitch(
                id=new_id(), scope=scope, target=await _target(st, scope, target),
                reason=reason, created_at=now, created_by=getpass.getuser(),
                expires_at=now + expires_in if expires_in else None))

        switch = with_store(cfg, run)
        poke(cfg.data_dir, "wake")
        if as_json:
            emit(record_json(switch))
        else:
            typer.echo(f"kill switch {switch.id} on ({_scope(switch)}): new runs are denied, "
                       "running ones stopped")

    @ks.command("off")
    def kill_off(switch_id: Annotated[str | None, typer.Argument(
                     help="The switch: its id or a unique prefix or suffix (default: every "
                          "active one in --scope/--target).")] = None,
                 scope: ScopeOpt = ScopeKind.GLOBAL, target: TargetOpt = None,
                 as_json: JsonOpt = False, data_dir: DataDir = None,
                 config: ConfigOpt = None) -> None:
        """Lift kill switches (recorded as a new event; the activation stays on record)."""
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "kill-switch off")
        now = time.time()

        async def run(st: Store) -> list[KillSwitch]:
            active = await st.kill_switches(active_at=now)
            if switch_id:  # the id, or a unique prefix or suffix of it
                chosen_id = resolve(switch_id, [s.id for s in active], "active kill switch")
                chosen = [s for s in active if s.id == chosen_id]
            else:
                tgt = await _target(st, scope, target)
                chosen = [s for s in active if s.scope is scope and s.target == tgt]
                if not chosen and active:  # say which exist rather than "lifted 0"
                    raise InvalidRequest(
                        f"no active kill switch in scope {_scope_of(scope, tgt)}; active: "
                        + ", ".join(f"{s.id} ({_scope(s)})" for s in active)
                        + " — lift one by id (`corral kill-switch off ID`) or give its "
                          "--scope and --target")
            return [await st.lift_kill_switch(s.id, at=now, by=getpass.getuser())
                    for s in chosen]

        lifted = with_store(cfg, run)
        poke(cfg.data_dir, "wake")
        if as_json:
            emit([record_json(s) for s in lifted])
            return
        if not lifted:
            typer.echo("no active kill switch: nothing to lift")
            return
        typer.echo(f"lifted {len(lifted)} kill switch(es)"
                   + "".join(f"\n  {s.id} ({_scope(s)})" for s in lifted))

    _register_switch_status(ks, config_of, with_store, emit)


def _register_switch_status(ks: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                            emit: Emit) -> None:
    @ks.command("status")
    def kill_status(as_json: JsonOpt = False, data_dir: DataDir = None,
                    config: ConfigOpt = None) -> None:
        """Active kill switches."""
        cfg = config_of(data_dir, config)
        active = with_store(cfg, lambda st: st.kill_switches(active_at=time.time()))
        if as_json:
            emit([record_json(s) for s in active])
            return
        if not active:
            typer.echo("no active kill switch")
        for s in active:
            until = f", until {ts(s.expires_at)}" if s.expires_at else ""
            typer.echo(f"{s.id}  {_scope(s)}  since {ts(s.created_at)}{until}  by "
                       f"{s.created_by}: {s.reason}")


def _register_pause(app: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                    emit: Emit) -> None:
    @app.command()
    def pause(reason: Annotated[str, typer.Option("--reason", help="Recorded with it.")],
              scope: ScopeOpt = ScopeKind.GLOBAL, target: TargetOpt = None,
              as_json: JsonOpt = False, data_dir: DataDir = None,
              config: ConfigOpt = None) -> None:
        """Stop dispatching new runs in a scope; running attempts finish."""
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "pause")

        async def run(st: Store) -> Pause:
            return await st.activate_pause(Pause(
                id=new_id(), scope=scope, target=await _target(st, scope, target),
                reason=reason, created_at=time.time(), created_by=getpass.getuser()))

        p = with_store(cfg, run)
        poke(cfg.data_dir, "wake")
        if as_json:
            emit(record_json(p))
            return
        typer.echo(f"paused ({_scope(p)}): {p.id}; queued jobs wait, running ones finish")

    @app.command()
    def resume(scope: ScopeOpt = ScopeKind.GLOBAL, target: TargetOpt = None,
               as_json: JsonOpt = False, data_dir: DataDir = None,
               config: ConfigOpt = None) -> None:
        """Lift the pauses of a scope."""
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "resume")

        async def run(st: Store) -> list[Pause]:
            tgt = await _target(st, scope, target)
            return [await st.lift_pause(p.id, at=time.time(), by=getpass.getuser())
                    for p in await st.pauses(active_only=True)
                    if p.scope is scope and p.target == tgt]

        lifted = with_store(cfg, run)
        poke(cfg.data_dir, "wake")
        if as_json:
            emit([record_json(p) for p in lifted])
            return
        typer.echo(f"resumed: {len(lifted)} pause(s) lifted")


def _scope(s: KillSwitch | Pause) -> str:
    return _scope_of(s.scope, s.target)


def _scope_of(scope: ScopeKind, target: str | None) -> str:
    return scope.value if target is None else f"{scope.value} {target}"


def _register_approvals(app: typer.Typer, config_of: ConfigOf, with_store: WithStore,
                        emit: Emit) -> None:
    approvals = typer.Typer(no_args_is_help=True, help="Actions waiting for a human: a job, or "
                            "one exact tool call a guardrail sent for approval.")
    app.add_typer(approvals, name="approvals")

    @approvals.command("list")
    def approvals_list(state: Annotated[str | None, typer.Option(
                           "--state", help="pending | approved | denied | expired "
                           "(default: pending)")] = "pending",
                       job: Annotated[str | None, typer.Option("--job")] = None,
                       as_json: JsonOpt = False, data_dir: DataDir = None,
                       config: ConfigOpt = None) -> None:
        """Approvals, oldest first."""
        cfg = config_of(data_dir, config)

        async def fetch(st: Store) -> list[Approval]:
            job_id = (await st.get_job(job)).id if job else None
            try:
                wanted = ApprovalState(state) if state else None
            except ValueError:
                raise InvalidRequest(f"unknown approval state {state!r}") from None
            return await st.approvals(job_id=job_id, state=wanted)

        found = with_store(cfg, fetch)
        if as_json:
            emit([record_json(a) for a in found])
            return
        if not found:
            typer.echo("no approvals")
        for a in found:
            typer.echo(f"{a.id}  {a.state.value:<8} job {a.job_id}  {a.reason}  "
                       f"expires {ts(a.expires_at)}\n    {a.subject}")

    def decide(approval_id: str, state: ApprovalState, note: str, as_json: bool,
               data_dir: Path | None, config: Path | None) -> None:
        cfg = config_of(data_dir, config)
        operator_only(cfg.data_dir, "approvals approve" if state is ApprovalState.APPROVED
                      else "approvals deny")

        async def run(st: Store) -> Approval:
            active, _ = await active_config(st, cfg)  # the engine's roles and scheduler
            return await submissions(st, active).decide_approval(
                approval_id, state is ApprovalState.APPROVED, by=getpass.getuser(), note=note)

        a = with_store(cfg, run)
        poke(cfg.data_dir, "wake")
        if as_json:
            emit(record_json(a))
            return
        typer.echo(f"{a.id} {a.state.value}: {a.subject}")

    @approvals.command("approve")
    def approvals_approve(approval_id: Annotated[str, typer.Argument(help="The approval id.")],
                          note: Annotated[str, typer.Option("--note")] = "",
                          as_json: JsonOpt = False, data_dir: DataDir = None,
                          config: ConfigOpt = None) -> None:
        """Approve exactly the action the request names (its command, for a tool call)."""
        decide(approval_id, ApprovalState.APPROVED, note, as_json, data_dir, config)

    @approvals.command("deny")
    def approvals_deny(approval_id: Annotated[str, typer.Argument(help="The approval id.")],
                       note: Annotated[str, typer.Option("--note")] = "",
                       as_json: JsonOpt = False, data_dir: DataDir = None,
                       config: ConfigOpt = None) -> None:
        """Refuse it (for good: the agent's later tries are refused too)."""
        decide(approval_id, ApprovalState.DENIED, note, as_json, data_dir, config)
