"""`corral gc`: retention run once, now (services/retention.py, docs/how-to/retention.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from corral.runtime.control import operator_only
from corral.schemas import views

from .edge import config_or_fail, emit, with_store
from .options import ConfigOpt, DataDir, JsonOpt

if TYPE_CHECKING:
    from corral.services.retention import GcProgress


def register(app: typer.Typer) -> None:
    @app.command("gc")
    def gc(
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="List what would go; change nothing.")
        ] = False,
        as_json: JsonOpt = False,
        data_dir: DataDir = None,
        config: ConfigOpt = None,
    ) -> None:
        """Archive and remove terminal jobs past `retention` (corral.yaml): their rows go to a
        JSON Lines file under the archive directory first, then leave the store with their
        attempt directories and logs. Jobs that have not ended are never touched. A running
        engine does this every retention.interval_s too."""
        from corral.services import retention  # the metrics' bounds: loaded only here

        cfg = config_or_fail(data_dir, config)
        if not dry_run:
            operator_only(cfg.data_dir, "gc")

        def progress(p: GcProgress) -> None:
            typer.echo(
                f"gc: batch {p.batch}: {p.jobs} job(s) removed so far -> {p.archive}", err=True
            )

        result = with_store(
            cfg,
            lambda st: retention.gc(
                st, cfg, dry_run=dry_run, progress=None if as_json else progress
            ),
        )
        if as_json:
            emit(
                views.GcReport(
                    dry_run=result.dry_run,
                    jobs=result.jobs,
                    held=result.held,
                    attempt_dirs=result.attempt_dirs,
                    batches=result.batches,
                    archives=list(result.archives),
                    job_ids=list(result.job_ids),
                    records=dict(result.records),
                ).dump()
            )
            return
        held = (
            f"; {result.held} past retention must stay for now (a record of theirs follows a"
            " job that is kept, or an event sink has not published it)"
            if result.held
            else ""
        )
        if result.dry_run:
            typer.echo(
                f"would remove {result.jobs} job(s) and {result.attempt_dirs} attempt"
                f" directories{held}"
            )
            for job_id in result.job_ids[:50]:
                typer.echo(f"  {job_id}")
            if len(result.job_ids) > 50:
                typer.echo(f"  … and {len(result.job_ids) - 50} more (--json lists them all)")
            return
        typer.echo(
            f"removed {result.jobs} job(s) and {result.attempt_dirs} attempt directories,"
            f" archived to {len(result.archives)} file(s){held}"
        )
