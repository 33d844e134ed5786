"""When a training attempt ends well, its final metrics against its baseline's (`--compare-to
JOB`): the comparison goes on the job's timeline (`metric_comparison`), and a watched metric
worse by more than the threshold records an incident `metric_regression` (policy/regression.py
says how metrics compare). The runs are read from their offline W&B run files
(trace/wandbfile.py), as the runner recorded them on each job."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from corral.core.ports import JobRecords
from corral.domain.errors import CorralError
from corral.domain.governance import Incident, IncidentType
from corral.domain.ids import new_id
from corral.domain.models import Job, JobEvent
from corral.policy.regression import compare
from corral.policy.reports import SEVERITY
from corral.trace import wandbfile

log = logging.getLogger(__name__)


async def latest_run(store: JobRecords, job_id: str) -> Mapping[str, Any] | None:
    """The record of a job's last training attempt that ended well, with a run file."""
    found = None
    for _, event in await store.events(job_id):
        data = event.data or {}
        if event.kind == "training" and data.get("exit_code") == 0 and data.get("run_file"):
            found = data
    return found


async def summary_of(run_file: str) -> dict[str, Any]:
    run = await anyio.to_thread.run_sync(wandbfile.read, Path(run_file))
    return run.summary


async def check(store: JobRecords, job: Job, run: Mapping[str, Any], now: float) -> None:
    """Compare this attempt's run (`run`: its training record) with the baseline's."""
    training = job.options.extra.get("training")
    if not isinstance(training, dict) or not training.get("compare_to"):
        return
    attempt = run.get("attempt")
    try:
        base_job = await store.get_job(str(training["compare_to"]))
        base = await latest_run(store, base_job.id)
        if base is None:
            raise CorralError(f"job {base_job.id} has no finished training run to compare with")
        if not run.get("run_file"):
            raise CorralError("this run wrote no W&B run file")
        ours = await summary_of(str(run["run_file"]))
        theirs = await summary_of(str(base["run_file"]))
    except (CorralError, wandbfile.RunFileError) as err:
        await _note(store, job, attempt, f"cannot compare with the baseline: {err}", {})
        return
    threshold = float(training.get("threshold", 0.1))
    found = compare(ours, theirs, training.get("watch") or [], threshold)
    data = {
        "baseline_job": base_job.id,
        "baseline_run": base.get("run_id"),
        "run_id": run.get("run_id"),
        "threshold": threshold,
        "metrics": [c.as_dict() for c in found],
    }
    worse = [c for c in found if c.regressed]
    said = ", ".join(
        f"{c.metric} {c.value:.6g} vs {c.baseline:.6g} ({(c.change or 0) * 100:+.1f}%)"
        for c in worse
    )
    await _note(
        store,
        job,
        attempt,
        f"metric regression against {base_job.id}: {said}"
        if worse
        else f"no regression against {base_job.id}",
        data,
    )
    if worse:
        incident = Incident(
            id=new_id(),
            report_id=None,
            job_id=job.id,
            type=IncidentType.METRIC_REGRESSION,
            severity=SEVERITY[IncidentType.METRIC_REGRESSION],
            message=f"metric regression against {base_job.id}: {said}",
            created_at=now,
            context=data,
        )
        await store.append_incidents([incident])
        log.warning("job %s: metric regression against %s: %s", job.id, base_job.id, said)


async def _note(
    store: JobRecords, job: Job, attempt: Any, message: str, data: dict[str, Any]
) -> None:
    await store.append_events(
        [
            JobEvent(
                job_id=job.id,
                at=time.time(),
                kind="metric_comparison",
                attempt=attempt if isinstance(attempt, int) else None,
                message=message,
                data=data,
            )
        ]
    )
