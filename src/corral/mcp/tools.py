"""The MCP tools over the application services: what an agent may ask Corral, and the one
thing it may ask Corral to do (`submit_job`). Every tool acts for a `Caller` — a tenant and its
scopes — that the transport resolves: `corral mcp` once at start (the local user, or a token),
`/mcp` per HTTP request (the bearer token). docs/reference/mcp.md lists the tools.

A tool answers with a structured result (a model of schemas/mcp.py) or an error result whose
structured content is a `ToolFailure` (a machine code and a message; a retry delay under
backpressure, the scope that is missing). A job of another tenant is "not found", as a missing
one is. Nothing a tool raises reaches the agent as a traceback."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Annotated, TypeVar, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from corral import __version__
from corral.config import Config
from corral.core.ports import Store
from corral.domain import bounds
from corral.domain.errors import Backpressure, CorralError, InvalidRequest, NotPermitted
from corral.domain.models import DEFAULT_PRIORITY, Job
from corral.domain.states import JobState
from corral.domain.tokens import ADMIN
from corral.runtime.watch import engine_serving
from corral.schemas import mcp as out
from corral.schemas.views import JobDetail, WorldModel
from corral.services import Wake, overview, tenancy, world
from corral.services.submissions import LimitChoices, SubmitRequest, submit

log = logging.getLogger(__name__)
M = TypeVar("M")
READ, WRITE = "jobs:read", "jobs:write"
MAX_PAGE = 200  # jobs one list_jobs call returns at most
INSTRUCTIONS = (
    "Corral runs and governs jobs (commands and AI agents). Ask it instead of polling: "
    "job_status, list_jobs, job_trace_summary, cluster_state, queue_depth; submit_job queues "
    "a job when your access allows writing. Jobs are your tenant's only."
)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls the tools: a tenant, its scopes (`admin` implies every one), how its acts are
    attributed, and the job it runs inside (its submissions become that job's children)."""

    tenant: str
    scopes: tuple[str, ...]
    actor: str
    parent_job: str | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    def need(self, scope: str) -> None:
        if not self.allows(scope):
            raise MissingScope(scope, self.scopes)


class MissingScope(NotPermitted):
    def __init__(self, scope: str, has: tuple[str, ...]) -> None:
        super().__init__(
            f"this tool needs the scope {scope!r}; the caller has {', '.join(has) or 'none'}"
        )
        self.scope = scope


# The caller of one tool call, from its context (the transport decides how).
CallerOf = Callable[[Context], Awaitable[Caller]]


def failure(err: CorralError) -> CallToolResult:
    """An error result: one line for the agent, and the same as structured content."""
    retry = math.ceil(err.retry_after_s) if isinstance(err, Backpressure) else None
    message = str(err)
    if retry is not None and "retry after" not in message:
        message = f"{message}; retry after {max(1, retry)} s"
    body = out.ToolFailure(
        error=err.code,
        message=message,
        retry_after_s=None if retry is None else max(1, retry),
        needed_scope=err.scope if isinstance(err, MissingScope) else None,
    )
    return CallToolResult(
        content=[TextContent(type="text", text=f"{err.code}: {message}")],
        structured_content=body.dump(),
        is_error=True,
    )


async def answer(work: Awaitable[M]) -> M:
    """`work`'s result, or an error result in its place (typed as the result: the SDK passes a
    CallToolResult through as it is)."""
    try:
        return await work
    except CorralError as err:
        return cast(M, failure(err))
    except Exception as err:  # a bug: said in one line, the details in the server's log
        log.exception("MCP tool failed")
        return cast(
            M,
            failure(CorralError(f"internal error ({type(err).__name__}); see the server's log")),
        )


class Tools:
    """The tools over one store and configuration."""

    def __init__(self, store: Store, config: Config, wake: Wake, caller_of: CallerOf) -> None:
        self.store, self.config, self.wake, self.caller_of = store, config, wake, caller_of

    async def caller(self, ctx: Context, scope: str) -> Caller:
        who = await self.caller_of(ctx)
        who.need(scope)
        return who

    async def job(self, ctx: Context, job_id: str) -> tuple[Caller, Job]:
        who = await self.caller(ctx, READ)
        bounds.text("job_id", job_id)
        return who, await tenancy.job_of(self.store, job_id.strip(), who.tenant)

    # ---- read-only ----------------------------------------------------------------------------

    async def job_status(self, ctx: Context, job_id: str) -> JobDetail:
        _, job = await self.job(ctx, job_id)
        return JobDetail.of(job)

    async def list_jobs(
        self,
        ctx: Context,
        state: str | None,
        role: str | None,
        limit: int,
        cursor: str | None,
    ) -> out.JobList:
        who = await self.caller(ctx, READ)
        wanted = _state(state)
        page = await tenancy.jobs_of(
            self.store, who.tenant, state=wanted, role=role, limit=limit, cursor=cursor
        )
        return out.JobList(jobs=[JobDetail.of(j) for j in page.jobs], next_cursor=page.next_cursor)

    async def job_trace_summary(self, ctx: Context, job_id: str) -> out.TraceSummary:
        _, job = await self.job(ctx, job_id)
        s = await overview.trace_summary(self.store, job)
        return out.TraceSummary(
            job=job.id,
            state=job.state.value,
            worker=job.worker,
            attempts=s.attempts,
            tool_calls=s.tool_calls,
            denied=s.denied,
            tokens_in=s.tokens_in,
            tokens_out=s.tokens_out,
            cost_usd=s.cost_usd,
            verdicts=s.verdicts,
            tools=[out.ToolTally(tool=t.tool, calls=t.calls, denied=t.denied) for t in s.tools],
            denials=[
                out.Denial(
                    attempt=d.attempt,
                    tool=d.tool,
                    stage=d.stage,
                    reason=d.reason,
                    message=d.message,
                )
                for d in s.denials
            ],
        )

    async def cluster_state(self, ctx: Context) -> out.ClusterState:
        who = await self.caller(ctx, READ)
        f = await overview.fleet_state(self.store, self.config, who.tenant)
        return out.ClusterState(
            tenant=who.tenant,
            environments=[
                out.Environment(
                    name=e.name,
                    kind=e.kind,
                    max_inflight=e.max_inflight,
                    max_queued=e.max_queued,
                    in_flight=e.in_flight,
                    queued=e.queued,
                    tenant_in_flight=e.tenant_in_flight,
                    tenant_queued=e.tenant_queued,
                )
                for e in f.environments
            ],
            max_queued=f.max_queued,
            queued=f.queued,
            in_flight=f.in_flight,
            engine_serving=await engine_serving(self.config, self.store, time.time()),
            counted_up_to_cap=f.capped,
        )

    async def world_model(self, ctx: Context) -> WorldModel:
        who = await self.caller(ctx, READ)
        snap = await world.snapshot(
            self.store, self.config.settings, world.Scope(tenant=who.tenant)
        )
        return world.world_view(snap)

    async def queue_depth(self, ctx: Context, job_id: str | None) -> out.QueueDepth:
        who = await self.caller(ctx, READ)
        job = None if job_id is None else (await self.job(ctx, job_id))[1]
        q = await overview.queue_depth(self.store, self.config, who.tenant, job)
        place = (
            None
            if q.placement is None or job is None
            else out.Placement(
                job=job.id,
                queue_position=q.placement.queue_position,
                estimated_start_s=q.placement.estimated_start_s,
            )
        )
        return out.QueueDepth(
            tenant=who.tenant,
            queued=q.queued,
            max_queued=q.max_queued,
            by_priority=q.by_priority,
            by_environment=q.by_environment,
            tenant_queued=q.tenant_queued,
            counted_up_to_cap=q.capped,
            placement=place,
        )

    # ---- writing ------------------------------------------------------------------------------

    async def submit_job(self, ctx: Context, req: SubmitRequest) -> out.JobSubmitted:
        who = await self.caller(ctx, WRITE)
        req = replace(req, tenant=who.tenant, parent_id=who.parent_job, by=who.actor)
        done = await submit(self.store, self.config, req, self.wake)
        r = done.result
        log.info(
            "job %s %s over MCP by %s (%s)",
            r.job.id,
            "submitted" if r.created else "coalesced",
            who.actor,
            r.job.state.value,
        )
        return out.JobSubmitted(
            created=r.created,
            coalesced_on=r.coalesced_on,
            engine_serving=done.engine_serving,
            job=JobDetail.of(r.job),
        )


def _state(text: str | None) -> JobState | None:
    if text is None or not text.strip():
        return None
    try:
        return JobState(text.strip().upper())
    except ValueError:
        raise InvalidRequest(
            f"state must be one of {', '.join(s.value for s in JobState)}, not {text!r}"
        ) from None


JobIdArg = Annotated[str, Field(description="The job's whole id.", max_length=200)]
READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)


def build_server(store: Store, config: Config, wake: Wake, caller_of: CallerOf) -> MCPServer:
    """Corral's MCP server with its tools, each acting for the caller `caller_of` resolves."""
    t = Tools(store, config, wake, caller_of)
    server: MCPServer = MCPServer(
        "corral", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )

    @server.tool(annotations=READ_ONLY)
    async def job_status(job_id: JobIdArg, ctx: Context) -> JobDetail:
        """A job of your tenant: its state, role, worker, attempts, exit code, last error."""
        return await answer(t.job_status(ctx, job_id))

    @server.tool(annotations=READ_ONLY)
    async def list_jobs(
        ctx: Context,
        state: Annotated[
            str | None, Field(description="Only jobs in this state (QUEUED, RUNNING, FAILED …).")
        ] = None,
        role: Annotated[str | None, Field(description="Only jobs of this role.")] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE, description="Jobs per page.")] = 20,
        cursor: Annotated[
            str | None, Field(description="The previous page's next_cursor.", max_length=200)
        ] = None,
    ) -> out.JobList:
        """Your tenant's jobs, newest first, a page at a time."""
        return await answer(t.list_jobs(ctx, state, role, limit, cursor))

    @server.tool(annotations=READ_ONLY)
    async def job_trace_summary(job_id: JobIdArg, ctx: Context) -> out.TraceSummary:
        """An agent job's trace in figures: tool calls per tool and how many were denied, the
        policy decisions by verdict, tokens and cost, and the latest denials with their reason."""
        return await answer(t.job_trace_summary(ctx, job_id))

    @server.tool(annotations=READ_ONLY)
    async def cluster_state(ctx: Context) -> out.ClusterState:
        """Each environment's caps (max in flight, max queued) against the attempts in flight
        and the jobs waiting there — the whole fleet's and your tenant's — and whether an engine
        serves."""
        return await answer(t.cluster_state(ctx))

    @server.tool(annotations=READ_ONLY)
    async def world_model(ctx: Context) -> WorldModel:
        """The world model of your tenant's jobs: running agents (tool calls so far, the tool
        they are in), each environment's slots and queue, who spawned, blocks or waits on whom,
        the causal graph from intent to outcome, and any deadlock found among them."""
        return await answer(t.world_model(ctx))

    @server.tool(annotations=READ_ONLY)
    async def queue_depth(
        ctx: Context,
        job_id: Annotated[
            str | None,
            Field(description="One of your waiting jobs: where it stands.", max_length=200),
        ] = None,
    ) -> out.QueueDepth:
        """How many jobs wait (by priority, by environment, how many are yours) against the
        queue's bound; with job_id, its position and an estimated start."""
        return await answer(t.queue_depth(ctx, job_id))

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, openWorldHint=False))
    async def submit_job(
        ctx: Context,
        prompt: Annotated[
            str | None, Field(description="What an agent job is asked to do.")
        ] = None,
        command: Annotated[
            list[str] | None,
            Field(description='A command job\'s argv, e.g. ["make", "test"].', max_length=1000),
        ] = None,
        role: Annotated[str | None, Field(description="The role (default: the default).")] = None,
        environment: Annotated[str | None, Field(description="Where it runs.")] = None,
        priority: Annotated[
            int, Field(ge=0, le=4, description="0 critical … 4 backlog.")
        ] = DEFAULT_PRIORITY,
        timeout_s: Annotated[float | None, Field(gt=0, description="Per attempt.")] = None,
        max_attempts: Annotated[int | None, Field(ge=1, le=bounds.MAX_ATTEMPTS)] = None,
        idempotency_key: Annotated[
            str | None,
            Field(
                description="The same key twice gives the same job (as `corral submit --key`).",
                max_length=200,
            ),
        ] = None,
        after: Annotated[
            list[str] | None, Field(description="Jobs that must succeed first.", max_length=100)
        ] = None,
        cwd: Annotated[str | None, Field(description="Working directory.")] = None,
    ) -> out.JobSubmitted:
        """Queue a job for your tenant (needs the jobs:write scope). It is governed like every
        submission: the pre-run policy may deny it (state DENIED, the reason in last_error) or
        hold it for approval; a full queue is an error saying how long to wait before retrying."""
        req = SubmitRequest(
            command=tuple(command or ()),
            prompt=prompt,
            role=role,
            env_name=environment,
            priority=priority,
            key=idempotency_key,
            limits=LimitChoices(max_attempts=max_attempts, timeout_s=timeout_s),
            after=tuple(after or ()),
            cwd=cwd,
        )
        return await answer(t.submit_job(ctx, req))

    return server


def fixed(caller: Caller) -> CallerOf:
    """The same caller for every call (stdio: one user per process)."""

    async def of(_: Context) -> Caller:
        return caller

    return of
