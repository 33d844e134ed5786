"""The structured results of Corral's MCP tools (src/corral/mcp/, docs/reference/mcp.md): each
tool's `outputSchema` is one of these models, so an agent gets JSON it can rely on. An error
result carries a `ToolFailure` instead."""

from __future__ import annotations

from pydantic import Field

from .views import JobDetail, View


class JobList(View):
    """A page of the caller's tenant's jobs, newest first; `next_cursor` asks for the next page
    (None: the last one)."""

    jobs: list[JobDetail]
    next_cursor: str | None


class ToolTally(View):
    tool: str
    calls: int
    denied: int


class Denial(View):
    attempt: int | None
    tool: str = Field(description="The tool (or the spawn) that was denied.")
    stage: str
    reason: str
    message: str


class TraceSummary(View):
    """An agent job's trace in figures."""

    job: str
    state: str
    worker: str
    attempts: int
    tool_calls: int
    denied: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None
    verdicts: dict[str, int] = Field(description="Policy decisions of the job by verdict.")
    tools: list[ToolTally]
    denials: list[Denial] = Field(description="The latest denials, oldest first.")


class Environment(View):
    name: str
    kind: str
    max_inflight: int
    max_queued: int | None
    in_flight: int = Field(description="Attempts starting or running here, every tenant's.")
    queued: int = Field(description="Jobs waiting here (queued or waiting to retry).")
    tenant_in_flight: int
    tenant_queued: int


class ClusterState(View):
    """Every environment's caps and load, and the engines serving the data directory."""

    tenant: str
    environments: list[Environment]
    max_queued: int = Field(description="The bound on waiting jobs over every environment.")
    queued: int
    in_flight: int
    engine_serving: bool
    counted_up_to_cap: bool = Field(
        description="True when the waiting jobs were too many to count them all."
    )


class Placement(View):
    job: str
    queue_position: int = Field(description="Jobs ahead of it (0: next).")
    estimated_start_s: float


class QueueDepth(View):
    tenant: str
    queued: int
    max_queued: int
    by_priority: dict[str, int]
    by_environment: dict[str, int]
    tenant_queued: int
    counted_up_to_cap: bool
    placement: Placement | None = Field(
        None, description="Where the job asked about stands, when it is waiting."
    )


class JobSubmitted(View):
    """The job a submission resolved to: a new one, or the one its idempotency key coalesced
    into (`created` false)."""

    created: bool
    coalesced_on: str | None
    engine_serving: bool
    job: JobDetail


class ToolFailure(View):
    """An error result's structured content."""

    error: str = Field(description="A machine code: not_found, not_permitted, backpressure, …")
    message: str
    retry_after_s: int | None = Field(None, description="Backpressure: retry after this long.")
    needed_scope: str | None = None
