"""The CLI against a remote engine: with `--url` (or `CORRAL_URL`) and `CORRAL_TOKEN`, the job
commands call the HTTP API through corral.client instead of opening the local store. The
answers come back as the API's views; they are turned back into the domain values the local
commands render (cli/views.py), so a command prints the same table or the same `--json`
either way, and an error answer ends with the exit code of the same error locally.

Imported only when a URL is given: httpx and the client stay out of a local command's start-up."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TextIO, TypeVar

import anyio

from corral.domain import agents as da
from corral.domain import models as dm
from corral.domain.errors import CorralError, InvalidRequest, NotPermitted
from corral.domain.states import AttemptState, JobState, Outcome
from corral.schemas import views as sv

from .exits import fail

if TYPE_CHECKING:
    from corral.client import AsyncClient

T = TypeVar("T")
Stream = Literal["stdout", "stderr"]
TOKEN_ENV = "CORRAL_TOKEN"


def run(url: str, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Call the API at `url` as the holder of `CORRAL_TOKEN`; an error answer ends the command
    with its one line and exit code."""
    from corral.client import AsyncClient

    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        fail(
            NotPermitted(
                f"--url needs a token: set {TOKEN_ENV} to one from `corral token create` "
                "on the engine's machine"
            )
        )

    async def main() -> T:
        async with AsyncClient(url, token) as c:
            return await fn(c)

    try:
        return anyio.run(main)
    except CorralError as err:  # ApiError included: its code picks the exit code
        fail(err)


def local_only(what: str, url: str) -> CorralError:
    """The error for an option or command that only has a meaning on the engine's machine."""
    return InvalidRequest(
        f"{what} works on the local data directory only, not against --url {url} "
        "(unset CORRAL_URL, or run it on the engine's machine)"
    )


# ---- the API's views back into domain values ---------------------------------------------


def epoch(t: str | None) -> float | None:
    return None if t is None else dt.datetime.fromisoformat(t).timestamp()


def _epoch0(t: str | None) -> float:
    return epoch(t) or 0.0


def job(v: sv.JobDetail) -> dm.Job:
    """A job as the API showed it (its environment values are never shown: empty here)."""
    return dm.Job(
        id=v.id,
        state=v.state,
        role=v.role,
        worker=v.worker,
        env_name=v.env,
        priority=v.priority,
        tenant=v.tenant,
        command=tuple(v.command),
        prompt=v.prompt,
        cwd=v.cwd,
        env={},
        options=dm.JobOptions(
            resume_from=v.resume_from, secret_env=tuple(v.secret_env), detached=v.detached
        ),
        limits=dm.Limits(
            max_attempts=v.max_attempts,
            timeout_s=v.timeout_s,
            grace_s=v.grace_s,
            max_tool_calls=v.max_tool_calls,
            token_budget_in=v.token_budget_in,
            token_budget_out=v.token_budget_out,
        ),
        key=v.key,
        dedup=v.dedup,
        workspace=v.workspace,
        parent_id=v.parent_id,
        depth=v.depth,
        created_at=_epoch0(v.created_at),
        updated_at=_epoch0(v.updated_at),
        sort_at=_epoch0(v.created_at),
        retry_at=epoch(v.retry_at),
        attempts=v.attempts if isinstance(v.attempts, int) else len(v.attempts),
        deps_pending=v.deps_pending,
        after=tuple(v.after),
        last_error=v.last_error,
        exit_code=v.exit_code,
        limit_hit=v.limit_hit,
        cancel_requested=v.cancel_requested,
        stop_kind=v.stop_kind,
        requeued_from=v.requeued_from,
        dlq_resolution=v.dlq_resolution,
    )


def attempt(job_id: str, v: sv.Attempt) -> dm.Attempt:
    return dm.Attempt(
        id=v.id,
        job_id=job_id,
        index=v.index,
        state=AttemptState(v.state),
        permit_id=v.permit_id,
        deadline_at=_epoch0(v.deadline_at),
        created_at=_epoch0(v.started),
        dir=v.log_dir,
        engine_id="",
        pid=v.pid,
        started_at=epoch(v.started),
        ended_at=epoch(v.ended),
        exit_code=v.exit_code,
        signal=v.signal,
        outcome=Outcome(v.outcome) if v.outcome else None,
        error=v.error,
        limit_hit=v.limit_hit,
    )


def event(job_id: str, v: sv.JobEvent) -> dm.JobEvent:
    return dm.JobEvent(
        job_id=job_id,
        at=_epoch0(v.at),
        kind=v.kind,
        message=v.message,
        from_state=v.from_,
        to_state=v.to,
        attempt=v.attempt,
        data=dict(v.data),
    )


def agent_event(v: sv.AgentEvent) -> da.AgentEvent:
    data = v.model_dump(mode="json")
    return da.AgentEvent.from_dict({**data, "at": _epoch0(v.at)})


def evaluation(v: sv.PolicyEvaluation) -> da.PolicyEvaluation:
    return da.PolicyEvaluation(
        id=v.id,
        at=_epoch0(v.at),
        job_id=v.job,
        attempt=v.attempt,
        stage=v.stage,
        subject=v.subject,
        verdict=v.verdict,
        reason=v.reason,
        message=v.message,
        inputs=dict(v.inputs),
    )


def record(cls: type[T], v: sv.View) -> T:
    """A governance record (kill switch, approval …) from its view: its ISO times as epoch
    seconds again, every other field as the view parsed it."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(v, f.name)
        if f.name == "at" or f.name.endswith("_at"):
            value = epoch(value)
        values[f.name] = value
    return cls(**values)


def show_json(v: sv.JobShow) -> dict[str, Any]:
    """`show --json`: the API's answer is the same schema."""
    return v.dump()


def list_json(v: sv.JobDetail) -> dict[str, Any]:
    """A job in `jobs --json` and `dlq list --json` (the short form of the list)."""
    return sv.Job.model_validate({k: getattr(v, k) for k in sv.Job.model_fields}).dump()


# ---- naming a job as the local CLI does ----------------------------------------------------


async def on_job(c: AsyncClient, ref: str, call: Callable[[str], Awaitable[T]]) -> T:
    """`call` with the whole id of the token's tenant's job that `ref` names: the whole id, or
    a unique prefix or suffix of 4+ characters, as locally. None of the tenant's: NotFound;
    several: InvalidRequest listing them — the local command's errors and exit codes."""
    return await call(await c.resolve(ref))


# ---- following a job over HTTP -----------------------------------------------------------


async def copy_logs(c: AsyncClient, ref: str, *, follow: bool, only: int | None) -> None:
    """A job's stdout to our stdout and its stderr to our stderr, attempt by attempt (as
    `corral logs`); with `follow`, the latest attempt's as it grows until the job ends."""
    import sys

    job_id = await c.resolve(ref)
    shown = await c.get(job_id)
    indexes = [a.index for a in shown.attempts if only in (None, a.index)]
    if follow and only is None and indexes:
        indexes = indexes[:-1]  # the latest one is followed below, retries with it
    outs: dict[Stream, TextIO] = {"stdout": sys.stdout, "stderr": sys.stderr}
    for index in indexes:
        for name, out in outs.items():
            offset = 0
            while True:
                r = await c.logs(job_id, stream=name, attempt=index, offset=offset)
                out.write(r.data)
                offset = r.next_offset
                if not r.data:
                    break
            out.flush()
    if not follow:
        return

    async def stream(name: Stream) -> None:
        out = outs[name]
        async for chunk in c.logs(job_id, stream=name, attempt=only, follow=True):
            out.write(chunk.data)
            out.flush()

    async with anyio.create_task_group() as tg:
        for name in outs:
            tg.start_soon(stream, name)


async def follow_job(
    c: AsyncClient, ref: str, *, until: str, timeout: float | None, output: bool
) -> tuple[dm.Job, bool]:
    """Wait for the job to end (or run, `until="running"`), copying its output when asked;
    the job as last seen, and whether it got there within `timeout`."""
    job_id = await c.resolve(ref)
    deadline = None if timeout is None else anyio.current_time() + timeout
    if until == "running":
        while True:
            v = await c.get(job_id)
            if v.state is JobState.RUNNING or v.state.terminal:
                return job(v), True
            if deadline is not None and anyio.current_time() >= deadline:
                return job(v), False
            await anyio.sleep(0.25)
    if output:
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            await copy_logs(c, job_id, follow=True, only=None)
    left = None if deadline is None else max(0.0, deadline - anyio.current_time())
    ended = await c.wait(job_id, timeout_s=left)
    return job(ended), ended.state.terminal
