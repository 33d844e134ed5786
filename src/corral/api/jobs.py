"""`/api/v1/jobs`: submit, list, get, cancel, logs (a byte range or server-sent events),
trace, report and wait; each route calls one service (services/) for the caller's tenant."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from corral.domain import bounds
from corral.domain.errors import InvalidRequest
from corral.domain.models import Job
from corral.domain.states import JobState
from corral.domain.tokens import ApiToken
from corral.schemas import api as bodies
from corral.schemas import views
from corral.services import cancellation, queries, runs, tenancy, training
from corral.services import logs as job_logs
from corral.services.submissions import LimitChoices, SubmitRequest, submit

from .auth import JobsRead, JobsWrite, actor
from .state import ApiState, state_of

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
JobId = Annotated[str, "the job's whole id"]
FOLLOW_POLL_S = 0.2


def detail(j: Job) -> views.JobDetail:
    return views.JobDetail.of(j)


def submit_request(body: bodies.JobCreate, token: ApiToken, key: str | None) -> SubmitRequest:
    """What a submission body asks for, as `corral submit` would: the token's tenant (another
    only for an admin token), the `Idempotency-Key` header as the job's key."""
    tenant = tenancy.tenant_for_submission(token.tenant, body.tenant, admin=token.allows("admin"))
    req = SubmitRequest(
        command=tuple(body.command),
        prompt=body.prompt,
        role=body.role,
        env_name=body.env_name,
        priority=body.priority,
        tenant=tenant,
        key=key,
        dedup=body.dedup,
        limits=LimitChoices(max_attempts=body.max_attempts, timeout_s=body.timeout_s),
        after=tuple(body.after),
        cwd=body.cwd,
        env=dict(body.env),
        worker=body.worker,
        resume_from=body.resume_from,
        by=actor(token),
    )
    t = body.training
    if t is None:
        return req
    if body.command:
        raise InvalidRequest("a training job runs its script: give `training`, not `command`")
    if not Path(t.script).is_absolute() and not body.cwd:
        raise InvalidRequest("a relative training script needs the body's cwd")
    return training.training_request(
        req,
        t.method,
        t.script,
        model=t.model,
        dataset=t.dataset,
        args=t.args,
        compare_to=t.compare_to,
        watch=t.watch,
        threshold=t.threshold,
        wandb_project=t.wandb_project,
    )


@router.post(
    "",
    status_code=201,
    response_model=bodies.JobCreated,
    responses={
        200: {
            "model": bodies.JobCreated,
            "description": "Coalesced into an existing job (same key).",
        }
    },
)
async def create_job(
    body: bodies.JobCreate,
    request: Request,
    token: JobsWrite,
    idempotency_key: Annotated[
        str | None, Header(max_length=200, description="As `corral submit --key`.")
    ] = None,
) -> Any:
    """Submit a job, as `corral submit`: 201 with the new job, 200 with the job a held
    `Idempotency-Key` coalesced into, 429 with Retry-After over a queue cap."""
    st = state_of(request)
    req = submit_request(body, token, idempotency_key)
    done = await submit(st.store, st.config, req, st.wake, services=st.submissions)
    r = done.result
    out = bodies.JobCreated(
        created=r.created,
        coalesced_on=r.coalesced_on,
        superseded=r.superseded,
        engine_serving=done.engine_serving,
        job=detail(r.job),
    )
    # serialised by pydantic in one step (not to a dict, then by json.dumps): the same JSON
    return Response(
        out.model_dump_json(by_alias=True),
        status_code=201 if r.created else 200,
        media_type="application/json",
    )


@router.get("", response_model=bodies.JobPage)
async def list_jobs(
    request: Request,
    token: JobsRead,
    state: JobState | None = None,
    role: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
    ref: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=100,
            description="Only the jobs this names: the whole id, or a prefix or suffix of "
            "4+ characters (how `corral --url` resolves a short id).",
        ),
    ] = None,
) -> Any:
    """The token's tenant's jobs, newest first, a page at a time (`cursor`: the previous
    page's `next_cursor`)."""
    page = await tenancy.jobs_of(
        state_of(request).store,
        token.tenant,
        state=state,
        role=role,
        limit=limit,
        cursor=cursor,
        ref=ref,
    )
    return bodies.JobPage(jobs=[detail(j) for j in page.jobs], next_cursor=page.next_cursor).dump()


@router.get("/{job_id}", response_model=views.JobShow)
async def get_job(job_id: JobId, request: Request, token: JobsRead) -> Any:
    """A job with its attempts, timeline and agents' traces (as `corral show --json`)."""
    st = state_of(request)
    await tenancy.job_of(st.store, job_id, token.tenant)
    d = await queries.job_detail(st.store, job_id)
    return views.JobShow(
        **{
            **views.JobDetail.fields_of(d.job),
            "attempts": [views.Attempt.of(a) for a in d.attempts],
            "timeline": [views.JobEvent.of(e) for e in d.timeline],
            "agent_events": [views.AgentEvent.of(e) for e in d.agent_events],
            "trace_id": d.trace_id,
            "runs": [run_view(r) for r in await runs.training_runs(st.store, d.job)],
        }
    ).dump()


def run_view(r: runs.TrainingRun) -> views.TrainingRun:
    return views.TrainingRun(**dataclasses.asdict(r))


@router.get("/{job_id}/runs", response_model=views.TrainingRuns)
async def get_runs(job_id: JobId, request: Request, token: JobsRead) -> Any:
    """A training job's W&B runs, one per attempt: the run id, the model pushed, the run's
    config, summary and loss curve (read from its offline run file); none for other jobs."""
    st = state_of(request)
    job = await tenancy.job_of(st.store, job_id, token.tenant)
    found = await runs.training_runs(st.store, job)
    return views.TrainingRuns(job_id=job.id, runs=[run_view(r) for r in found]).dump()


@router.post("/{job_id}/cancel", response_model=views.Cancelled)
async def cancel_job(
    job_id: JobId, request: Request, token: JobsWrite, body: bodies.CancelBody | None = None
) -> Any:
    """Cancel a job and the jobs it submitted (409 when it has ended already); the reason
    recorded names the token."""
    st = state_of(request)
    await tenancy.job_of(st.store, job_id, token.tenant)
    reason = f"{(body or bodies.CancelBody()).reason} (by {actor(token)})"
    done = await cancellation.cancel(
        st.store, st.config, job_id, reason=reason, caller=None, wake=st.wake
    )
    j = done.job
    return views.Cancelled(id=j.id, state=j.state, cancel_requested=j.cancel_requested).dump()


@router.get("/{job_id}/trace", response_model=views.Trace)
async def job_trace(job_id: JobId, request: Request, token: JobsRead) -> Any:
    """An agent job's traces and policy decisions (as `corral trace --json`)."""
    st = state_of(request)
    await tenancy.job_of(st.store, job_id, token.tenant)
    t = await queries.trace(st.store, job_id)
    return views.Trace(
        job=t.job.id,
        state=t.job.state,
        worker=t.job.worker,
        agent_events=[views.AgentEvent.of(e) for e in t.agent_events],
        policy_evaluations=[views.PolicyEvaluation.of(e) for e in t.evaluations],
    ).dump()


@router.get("/{job_id}/report", response_model=views.RunReport | views.NoReport)
async def job_report(job_id: JobId, request: Request, token: JobsRead) -> Any:
    """The job's run report with its incidents, or why there is none yet."""
    st = state_of(request)
    await tenancy.job_of(st.store, job_id, token.tenant)
    r = await queries.report(st.store, job_id)
    if r.report is None:
        return views.NoReport(job=r.job.id, report=None, reason=r.missing_because()).dump()
    data = views.record(r.report).dump()
    data["incidents"] = [views.record(i).dump() for i in r.incidents]
    return views.RunReport.model_validate(data).dump()


@router.get("/{job_id}/wait", response_model=views.JobDetail)
async def wait_job(
    job_id: JobId,
    request: Request,
    token: JobsRead,
    timeout_s: Annotated[float, Query(ge=0, le=bounds.MAX_EXPIRES_S)] = 30.0,
) -> Any:
    """A long poll: the job once it has ended, or as it is after `timeout_s` seconds."""
    st = state_of(request)
    await tenancy.job_of(st.store, job_id, token.tenant)
    return detail(await queries.wait_until_ended(st.store, job_id, timeout_s=timeout_s)).dump()


@router.get(
    "/{job_id}/logs",
    response_model=bodies.LogRange,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def job_logs_route(
    job_id: JobId,
    request: Request,
    token: JobsRead,
    stream: Literal["stdout", "stderr"] = "stdout",
    attempt: Annotated[int | None, Query(ge=1, le=bounds.MAX_ATTEMPTS)] = None,
    offset: Annotated[int, Query(ge=0, le=1 << 50)] = 0,
    limit: Annotated[int, Query(ge=1, le=job_logs.MAX_CHUNK)] = 65536,
    follow: bool = False,
) -> Response | Any:
    """A byte range of an attempt's output (default: the latest attempt's stdout); with
    `follow=true`, server-sent events (`event: log`, then `event: end`) until the job ends."""
    st = state_of(request)
    job = await tenancy.job_of(st.store, job_id, token.tenant)
    if follow:
        return StreamingResponse(
            _follow(st, job, stream, attempt, offset),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    c = await job_logs.log_chunk(
        st.store, job, stream=stream, attempt=attempt, offset=offset, limit=limit
    )
    return _range(c, stream).dump()


def _range(c: job_logs.LogChunk, stream: str) -> bodies.LogRange:
    return bodies.LogRange(
        attempt=c.attempt,
        stream=stream,
        offset=c.offset,
        next_offset=c.next_offset,
        complete=c.complete,
        data=c.data.decode(errors="replace"),
    )


async def _follow(
    st: ApiState, job: Job, stream: job_logs.Stream, attempt: int | None, offset: int
) -> AsyncIterator[str]:
    """Server-sent events of the output as it grows; the last one says how the job ended."""
    seen_attempt = attempt
    while True:
        c = await job_logs.log_chunk(
            st.store, job, stream=stream, attempt=seen_attempt, offset=offset
        )
        if c.data:
            yield f"event: log\ndata: {json.dumps(_range(c, stream).dump())}\n\n"
            offset = c.next_offset
            continue
        job = await st.store.get_job(job.id)
        if c.attempt is not None and attempt is None:
            latest = (await st.store.attempts(job.id))[-1].index
            if latest != c.attempt:  # a retry began: follow it from its start
                seen_attempt, offset = latest, 0
                continue
            seen_attempt = c.attempt
        if job.state.terminal and (c.complete or c.attempt is None):
            yield f"event: end\ndata: {json.dumps({'state': job.state.value})}\n\n"
            return
        await anyio.sleep(FOLLOW_POLL_S)
