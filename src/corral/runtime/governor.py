"""The governor: decides every tool call of every governed agent, and writes their traces.

Agent CLIs run `corral-hook` before and after each tool call (workers/agents/); the hook
forwards the CLI's payload to this socket and relays the answer. Before a call, the governor
reads how much the attempt has used (tool calls asked for so far, from the store; tokens, from the
attempt's own event stream on disk), runs the tool-call decision (policy/toolcall.py: a table of
pure steps; the governor reads the few facts a step asks for, such as a human's approval),
appends the policy evaluation, and answers in the CLI's hook language (each adapter's `reply`).
A runtime limit also schedules the attempt's stop after the worker's summary grace. After a
call, it appends a checkpoint (session id, calls so far, last tool, digest of the last output):
what an interrupted attempt resumes from. A background watch stops an attempt whose tokens or
cost run over budget between tool calls; a tool call made past a budget ceiling is denied on
the spot.

When an attempt ends, its AgentEvent is built from the durable records alone (the stream file,
the policy evaluations, the checkpoints), so an engine that restarted in between writes the same
trace. Everything recorded passes the redactor first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketStream

from corral.core.ports import JobRecords
from corral.domain.agents import AgentEvent, Checkpoint, PolicyEvaluation, ToolCallTrace
from corral.domain.bounds import loads_bounded
from corral.domain.errors import StoreError, WorkerError
from corral.domain.governance import Approval
from corral.domain.ids import new_id
from corral.domain.models import AttemptResult, Claimed, Job, JobEvent
from corral.domain.settings import Settings, WorkerSpec
from corral.policy import scopes as policy
from corral.policy import toolcall
from corral.policy.guardrails import EPIC_WORKER, Guardrails, approval_digest
from corral.policy.prerun import BUDGET_CEILING_LIMIT
from corral.policy.redact import Redactor
from corral.runtime import regressions
from corral.runtime.modelgate import ModelGateway
from corral.runtime.peers import Refused, check_user, credentials, refuse, restrict
from corral.workers.agents import ADAPTERS
from corral.workers.agents.base import (
    AGENT_FILE,
    AgentWorker,
    agent_home,
    attempt_ref,
    governance_socket,
    secret_values,
    summarize_stream,
)
from corral.workers.process import STDOUT
from corral.workers.sealing import Keeper, reveal_job
from corral.workers.streams import StreamParser, UsageEvent

log = logging.getLogger("corral.governor")

MAX_REQUEST = 8 << 20
REQUEST_TIMEOUT_S = 5.0
WATCH_INTERVAL_S = 0.5
MAX_RECORDED_CHARS = 2000  # of a tool input or output kept in a policy evaluation
# The decisions that spend the tool-call budget: a call refused for scope counts too, or an agent
# looping on refused calls would never reach its limit.
LIMITS = frozenset({"max_tool_calls", "token_budget_in", "token_budget_out"})
NOT_OFFERED = (
    "refused by the CLI: a tool outside this role's scope, which the model was never offered"
)
ALL = 1 << 31  # read every evaluation of an attempt (the store's default page is 1,000)


@dataclass(slots=True)
class _Monitor:
    """The live view of one attempt: its stream read so far, and its counters."""

    claimed: Claimed
    adapter: str
    redactor: Redactor
    scope: policy.Scope
    calls: int = 0  # tool calls asked for so far (allowed or refused for scope)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    offset: int = 0
    parser: StreamParser | None = None
    partial: bytes = b""
    pre_at: dict[str, float] = field(default_factory=dict)  # call id → when it was allowed
    stream: Path = Path()  # the attempt's stdout.log


Live = Callable[[str], Claimed | None]
StopForLimit = Callable[[str, str, float], Awaitable[None]]


class Governor:
    def __init__(
        self,
        *,
        store: JobRecords,
        settings: Settings,
        data_dir: Path,
        adapter_of: Callable[[str], str],
        live: Live,
        stop: StopForLimit,
        guardrails: Guardrails | None = None,
        clock: Callable[[], float] = time.time,
        keeper: Keeper | None = None,
    ) -> None:
        self.store = store
        self.keeper = keeper  # opens the jobs' sealed secrets, to redact them
        self.settings = settings
        self.data_dir = data_dir
        self.adapter_of = adapter_of
        self.live = live
        self.stop = stop
        self.clock = clock
        self.guardrails = guardrails or Guardrails(roles={})
        # Would this running cost cross a budget ceiling? (runtime/gate.py; None: no budgets)
        self.overrun: Callable[[Job, float, float], Awaitable[bool]] | None = None
        self.gateway: ModelGateway | None = None  # its figures join the stream's
        self._monitors: dict[str, _Monitor] = {}
        self._lock = anyio.Lock()
        self.socket_group: int | None = None  # engine.socket_group's gid (runtime/peers.py)

    def is_agent(self, kind: str) -> bool:
        return self.adapter_of(kind) in ADAPTERS

    # ---- serving the hook ---------------------------------------------------------------

    async def serve(self) -> None:
        path = governance_socket(self.data_dir)
        path.unlink(missing_ok=True)
        listener = await anyio.create_unix_listener(path)
        restrict(path, self.socket_group)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch)
                await listener.serve(self._connection)
        finally:
            path.unlink(missing_ok=True)

    async def _connection(self, stream: SocketStream) -> None:
        async with stream:
            try:  # the hook runs as the engine's user; anyone else is refused, and logged
                pid, uid, gid = credentials(stream.extra(SocketAttribute.raw_socket))
                check_user(pid, uid, gid, group=self.socket_group)
            except (OSError, Refused) as err:
                log.warning("governance.sock: refused: %s", err)
                await refuse(stream, f"2\ncorral: tool call denied: refused: {err}".encode())
                return
            data = b""
            with anyio.move_on_after(REQUEST_TIMEOUT_S):
                while len(data) <= MAX_REQUEST:
                    try:
                        data += await stream.receive(65536)
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
            try:
                code, text = await self.answer(data)
            except Exception as err:  # never let a bug allow a call: the hook fails closed
                log.exception("governance request failed")
                code, text = 2, f"corral: tool call denied: governance error ({err})"
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(f"{code}\n{text}".encode())

    async def answer(self, data: bytes) -> tuple[int, str]:
        """(exit code, text) for one hook request: header line, then the CLI's payload."""
        head, _, body = data.partition(b"\n")
        try:
            header = loads_bounded(head)
            payload = loads_bounded(body)
        except ValueError:  # a BoundError too: nested deeper than anyone's tool input
            return 2, "corral: tool call denied: malformed governance request"
        if not isinstance(header, dict) or not isinstance(payload, dict):
            return 2, "corral: tool call denied: malformed governance request"
        ref = str(header.get("attempt", ""))
        job_id, _, index = ref.rpartition(".")
        claimed = self.live(job_id)
        if (
            claimed is None
            or str(claimed.attempt.index) != index
            or header.get("token") != claimed.permit.id
        ):
            return 2, f"corral: tool call denied: {ref} is not a live attempt of this engine"
        cli = str(header.get("cli", ""))
        event = str(payload.get("hook_event_name", ""))
        monitor = await self._monitor(claimed)
        if event == "PreToolUse":
            deadline = header.get("deadline_ms")
            return await self._pre(
                monitor, cli, payload, deadline / 1000 if isinstance(deadline, int) else None
            )
        if event in ("PostToolUse", "PostToolUseFailure"):
            await self._post(monitor, payload)
        return 0, ""  # PostToolUse, or an event we do not govern

    async def _monitor(self, claimed: Claimed) -> _Monitor:
        ref = attempt_ref(claimed.job, claimed.attempt.index)
        m = self._monitors.get(ref)
        if m is not None and m.claimed.attempt.id == claimed.attempt.id:
            return m
        async with self._lock:  # two first calls of one attempt build one monitor
            m = self._monitors.get(ref)
            if m is not None and m.claimed.attempt.id == claimed.attempt.id:
                return m
            return await self._new_monitor(ref, claimed)

    async def _new_monitor(self, ref: str, claimed: Claimed) -> _Monitor:
        job = claimed.job
        role = self.settings.roles.get(job.role)
        m = _Monitor(
            claimed=claimed,
            adapter=self.adapter_of(job.worker),
            redactor=self.redactor(job),
            scope=policy.Scope.parse(role.tools if role else ()),
            stream=Path(claimed.attempt.dir) / STDOUT,
        )
        # After an engine restart the count comes back from the durable evaluations.
        evaluations = await self.store.policy_evaluations(
            job.id, attempt=claimed.attempt.index, limit=ALL
        )
        m.calls = sum(
            1
            for e in evaluations
            if e.stage in ("tool_call", "guardrail")
            and e.reason not in LIMITS
            and e.reason != toolcall.HOOK_TIMEOUT
        )
        self._monitors[ref] = m
        return m

    def redactor(self, job: Job) -> Redactor:
        """Every secret of the attempt's job: its worker's, its role's MCP servers', and its
        own (sealed at submission, or named by --secret-env)."""
        spec = self.settings.workers.get(job.worker) or WorkerSpec(name=job.worker)
        adapter = ADAPTERS.get(self.adapter_of(job.worker))
        values = secret_values(spec, adapter, self.settings.roles.get(job.role))
        try:
            values += reveal_job(job, self.keeper).secrets
        except WorkerError as err:  # the attempt itself fails on this; redact what is known
            log.warning("job %s: %s", job.id, err)
        return Redactor(values)

    def _read_stream(self, m: _Monitor) -> None:
        """Feed what the attempt's stream gained since the last look into its live parser."""
        if m.parser is None:
            m.parser = ADAPTERS[m.adapter].parser_for()
        path = m.stream
        try:
            if os.stat(path).st_size == m.offset:
                self._gateway_figures(m)
                return  # nothing new (the common case between two tool calls of one turn)
            with path.open("rb") as f:
                f.seek(m.offset)
                chunk = f.read()
        except FileNotFoundError:
            self._gateway_figures(m)
            return
        m.offset += len(chunk)
        *lines, m.partial = (m.partial + chunk).split(b"\n")
        now = self.clock()
        for line in lines:
            for ev in m.parser.feed(line, now):
                if isinstance(ev, UsageEvent):
                    m.tokens_in, m.tokens_out = ev.tokens_in, ev.tokens_out
                    if ev.cost_usd is not None:
                        m.cost_usd = ev.cost_usd
        self._gateway_figures(m)

    def _gateway_figures(self, m: _Monitor) -> None:
        """What the model gateway metered, when it saw more than the CLI reported (Codex
        reports its usage only at the end)."""
        usage = (
            self.gateway.usage(m.claimed.job.id, m.claimed.attempt.index) if self.gateway else None
        )
        if usage is not None:
            tin, tout, cost = usage.totals()
            m.tokens_in, m.tokens_out = max(m.tokens_in, tin), max(m.tokens_out, tout)
            m.cost_usd = max(m.cost_usd, cost)

    async def _pre(
        self, m: _Monitor, cli: str, payload: Mapping[str, Any], deadline: float | None = None
    ) -> tuple[int, str]:
        """Decide one tool call (policy/toolcall.py): read what a step asks for, record the
        verdict, reply. `deadline` (monotonic seconds) is when the hook gives up and denies the
        call itself: a decision reached later is recorded as that denial."""
        self._read_stream(m)
        tool = str(payload.get("tool_name") or "?")
        raw_input = payload.get("tool_input")
        tool_input: Mapping[str, Any] = raw_input if isinstance(raw_input, Mapping) else {}
        job = m.claimed.job
        call = self._call(m, tool, tool_input, payload)
        call_id = payload.get("tool_use_id")
        now = self.clock()
        used = m.calls
        facts = toolcall.CallFacts(
            call=call,
            role=job.role,
            scope=m.scope,
            guardrails=self.guardrails,
            used=policy.Usage(tool_calls=used, tokens_in=m.tokens_in, tokens_out=m.tokens_out),
            limits=job.limits,
            cost_usd=m.cost_usd,
            over_ceiling=None if self.overrun is not None else False,
            also=(EPIC_WORKER,) if job.options.epic else (),
        )
        # Counted before the first await, and given back once decided if the call was no use
        # (or the decision failed): concurrent calls of one attempt (a storm) each see the calls
        # before them, so the budget holds without a lock. A refused call counts.
        m.calls += 1
        try:
            d = await self._decide(m, facts, now, deadline)
        except BaseException:
            m.calls -= 1
            raise
        if not toolcall.counts(d):
            m.calls -= 1
        if d.verdict == "allow" and isinstance(call_id, str):
            m.pre_at[call_id] = now
        await self.store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=now,
                    job_id=job.id,
                    attempt=m.claimed.attempt.index,
                    stage=d.stage,
                    subject=tool,
                    verdict=d.verdict,
                    reason=d.reason,
                    message=m.redactor.text(d.message),
                    inputs={
                        "input": _clip(m.redactor.obj(dict(tool_input))),
                        "call_id": call_id,
                        "session_id": payload.get("session_id"),
                        "tool_calls": used,
                        "tokens_in": m.tokens_in,
                        "tokens_out": m.tokens_out,
                        "rule": d.rule,
                        "decided_by": d.decided_by,
                        "shell": call.shell,
                        "cwd": call.cwd,
                        "limits": {
                            "max_tool_calls": job.limits.max_tool_calls,
                            "token_budget_in": job.limits.token_budget_in,
                            "token_budget_out": job.limits.token_budget_out,
                        },
                        "scope": list(m.scope.rules),
                    },
                )
            ]
        )
        if d.limit is not None:
            await self.stop(job.id, d.limit, self._summary_grace(job.worker))
        return ADAPTERS.get(cli, AgentWorker).reply(d.verdict, d.message)

    def _call(
        self, m: _Monitor, tool: str, tool_input: Mapping[str, Any], payload: Mapping[str, Any]
    ) -> policy.Call:
        """The call and where it runs: the job's workspace, the directory the CLI runs it in
        (its `workdir`, if the tool takes one), the CLI's home, and the shell that runs it."""
        job = m.claimed.job
        workspace = os.path.abspath(job.cwd or os.getcwd())
        cwd = payload.get("cwd")
        cwd = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else workspace
        workdir = tool_input.get("workdir")
        if isinstance(workdir, str) and workdir:
            cwd = os.path.join(cwd, workdir)
        spec = self.settings.workers.get(job.worker) or WorkerSpec(name=job.worker)
        home = agent_home(self.data_dir, job, m.adapter)
        shell, problem = "bash", None
        if tool.lower() in policy.SHELL_TOOLS:
            shell, problem = ADAPTERS[m.adapter].call_shell(payload, home)
        return policy.Call(
            tool=tool,
            input=tool_input,
            workspace=workspace,
            cwd=cwd,
            home=spec.env.get("HOME") or str(home),
            shell=shell,
            problem=problem,
        )

    async def _decide(
        self, m: _Monitor, facts: toolcall.CallFacts, now: float, deadline: float | None
    ) -> toolcall.CallVerdict:
        """Run the decision's steps, reading each fact a step asks for when it asks."""
        out = toolcall.run(facts)
        while isinstance(out, toolcall.Need):
            facts = await self._read_fact(m, facts, out, now, deadline)
            out = toolcall.run(facts, after=out)
        return out

    async def _read_fact(
        self,
        m: _Monitor,
        facts: toolcall.CallFacts,
        need: toolcall.Need,
        now: float,
        deadline: float | None,
    ) -> toolcall.CallFacts:
        """Read the one fact a step of the decision asks for."""
        if need.fact == "over_ceiling":
            assert self.overrun is not None  # else the facts said False from the start
            return replace(
                facts, over_ceiling=await self.overrun(m.claimed.job, facts.cost_usd, self.clock())
            )
        if need.fact == "approval":
            return replace(facts, approval=await self._approval(m, need.so_far, now))
        return replace(facts, late=deadline is not None and time.monotonic() > deadline)

    async def _approval(self, m: _Monitor, guard: toolcall.CallVerdict, now: float) -> Approval:
        """The latest approval of exactly the action a guardrail sends to a human, for this job;
        the request is filed when there is none (one per exact action and job: a human's "no"
        stands)."""
        job = m.claimed.job
        subject = guard.approval_subject or ""
        digest = approval_digest(subject)
        mine = [a for a in await self.store.approvals(job_id=job.id) if a.digest == digest]
        if mine:
            return mine[-1]
        return await self.store.request_approval(
            Approval.asked(
                id=new_id(),
                job_id=job.id,
                subject=subject,
                reason=guard.reason,
                now=now,
                ttl_s=self.settings.approval_ttl_s,
            )
        )

    async def _post(self, m: _Monitor, payload: Mapping[str, Any]) -> None:
        job = m.claimed.job
        output = payload.get("tool_response", payload.get("error"))
        text = output if isinstance(output, str) else json.dumps(output, sort_keys=True)
        digest = hashlib.sha256(m.redactor.text(text).encode()).hexdigest()
        call_id = _str(payload.get("tool_use_id"))
        duration = payload.get("duration_ms")
        if not isinstance(duration, int) and call_id in m.pre_at:
            duration = round((self.clock() - m.pre_at[call_id]) * 1000)
        m.pre_at.pop(call_id or "", None)
        await self.store.append_checkpoint(
            Checkpoint(
                job_id=job.id,
                attempt=m.claimed.attempt.index,
                at=self.clock(),
                worker=job.worker,
                session_id=_str(payload.get("session_id")),
                tool_call_count=m.calls,
                last_tool=_str(payload.get("tool_name")),
                last_output_digest=digest,
                call_id=call_id,
                duration_ms=duration if isinstance(duration, int) else None,
            )
        )

    def _summary_grace(self, kind: str) -> float:
        spec = self.settings.workers.get(kind)
        return spec.summary_grace_s if spec else WorkerSpec(name=kind).summary_grace_s

    async def _watch(self) -> None:
        """Stop attempts whose tokens run over budget while they make no tool call."""
        while True:
            await anyio.sleep(WATCH_INTERVAL_S)
            for ref, m in list(self._monitors.items()):
                claimed = self.live(m.claimed.job.id)
                if claimed is None or claimed.attempt.id != m.claimed.attempt.id:
                    self._monitors.pop(ref, None)
                    continue
                self._read_stream(m)
                limits = m.claimed.job.limits
                for limit, spent, budget in (
                    ("token_budget_in", m.tokens_in, limits.token_budget_in),
                    ("token_budget_out", m.tokens_out, limits.token_budget_out),
                ):
                    if spent > budget:
                        await self.stop(m.claimed.job.id, limit, 0.0)
                try:
                    over = (
                        m.cost_usd
                        and self.overrun is not None
                        and await self.overrun(m.claimed.job, m.cost_usd, self.clock())
                    )
                except StoreError as err:  # a store outage: the next look asks again
                    log.warning("budget check of %s: %s", m.claimed.job.id, err)
                    continue
                if over:
                    await self.stop(m.claimed.job.id, BUDGET_CEILING_LIMIT, 0.0)

    async def started(self, claimed: Claimed) -> None:
        """Begin watching an agent attempt's tokens from its first line."""
        if self.is_agent(claimed.job.worker):
            await self._monitor(claimed)

    # ---- the trace --------------------------------------------------------------------------

    async def _notebook_copied(self, job: Job, index: int, attempt_dir: Path) -> None:
        """A notebook job's copy (where, its sha256, the parameters, the failing cell) on the
        job's timeline, as the runner recorded it in the attempt directory."""
        try:
            if (attempt_dir / NOTEBOOK_RECORD).stat().st_size > 256 * 1024:
                return
        except OSError:
            return
        record = _read_json(attempt_dir / NOTEBOOK_RECORD)
        if not record:
            return
        data = {k: record[k] for k in NOTEBOOK_KEYS if k in record}
        copied = (
            f"copied back to {data['path']} (sha256 {data.get('sha256')})"
            if data.get("path")
            else "not copied back"
        )
        await self.store.append_events(
            [
                JobEvent(
                    job_id=job.id,
                    at=time.time(),
                    kind="notebook",
                    attempt=index,
                    message=f"notebook {copied}",
                    data=data,
                )
            ]
        )

    async def _training_ran(self, job: Job, index: int, attempt_dir: Path) -> None:
        """A training attempt's W&B run and the model it pushed on the job's timeline, as the
        runner recorded them (workers/training.py); then its regression check."""
        record = _read_small_json(attempt_dir / TRAINING_RECORD)
        if not record:
            return
        data = {k: record[k] for k in TRAINING_KEYS if k in record}
        pushed = (
            f"; pushed {data['repo_id']} at {data.get('revision')}" if data.get("repo_id") else ""
        )
        await self.store.append_events(
            [
                JobEvent(
                    job_id=job.id,
                    at=time.time(),
                    kind="training",
                    attempt=index,
                    message=f"training run {data.get('run_id')}{pushed}",
                    data=data,
                )
            ]
        )
        if record.get("exit_code") == 0:
            try:
                await regressions.check(self.store, job, {**data, "attempt": index}, self.clock())
            except (StoreError, OSError) as err:  # the comparison is a report, never the job's end
                log.warning("regression check of %s: %s", job.id, err)

    async def ended(self, claimed: Claimed, result: AttemptResult) -> None:
        """Write the attempt's AgentEvent (once; an agent attempt only)."""
        job, attempt = claimed.job, claimed.attempt
        self._monitors.pop(attempt_ref(job, attempt.index), None)
        if "notebook" in job.options.extra:
            await self._notebook_copied(job, attempt.index, Path(attempt.dir))
        if "training" in job.options.extra:
            await self._training_ran(job, attempt.index, Path(attempt.dir))
        if not self.is_agent(job.worker):
            return
        adapter = ADAPTERS[self.adapter_of(job.worker)]
        attempt_dir = Path(attempt.dir)
        summary = summarize_stream(adapter.parser_for(), attempt_dir / STDOUT, result.exit_code)
        redactor = self.redactor(job)
        meta = _read_json(attempt_dir / AGENT_FILE)
        evaluations = [
            e
            for e in await self.store.policy_evaluations(job.id, attempt=attempt.index, limit=ALL)
            if e.stage in ("tool_call", "guardrail")
        ]
        checkpoints = [
            c for c in await self.store.checkpoints(job.id) if c.attempt == attempt.index
        ]
        denials = {str(e.inputs.get("call_id")): e for e in evaluations if e.verdict == "deny"}
        durations = {c.call_id: c.duration_ms for c in checkpoints if c.call_id}
        calls: list[ToolCallTrace] = []
        seen: set[str] = set()
        role = self.settings.roles.get(job.role)
        scope = policy.Scope.parse(role.tools if role else ())
        for call in summary.tool_calls if summary else ():
            seen.add(call.id)
            denial = denials.get(call.id)
            reason = denial.message if denial else None
            if reason is None and adapter.hides_tools and not scope.offers(call.tool):
                reason = NOT_OFFERED  # the model asked for a tool it was never given
            calls.append(
                ToolCallTrace(
                    tool=call.tool,
                    input=redactor.obj(dict(call.input)),
                    output=redactor.text(call.output) if call.output is not None else None,
                    duration_ms=durations.get(call.id, call.duration_ms),
                    denied=call.denied or reason is not None,
                    reason=reason,
                    call_id=call.id,
                )
            )
        for call_id, e in denials.items():  # Codex writes no item for a call a hook blocked
            if call_id not in seen:
                calls.append(
                    ToolCallTrace(
                        tool=e.subject,
                        input=dict(e.inputs.get("input") or {}),
                        denied=True,
                        reason=e.message,
                        call_id=call_id,
                    )
                )
        # Every allowed call is in the trace, even one the CLI wrote no item for (an attempt
        # stopped right after its hook allowed it). Codex's items have ids of their own, so
        # the surplus of allowed evaluations over the calls shown says how many are missing.
        allowed = [e for e in evaluations if e.verdict == "allow"]
        surplus = len(allowed) - sum(1 for c in calls if not c.denied)
        unmatched = [e for e in allowed if str(e.inputs.get("call_id")) not in seen]
        for e in unmatched[len(unmatched) - surplus :] if surplus > 0 else ():
            given = e.inputs.get("call_id")
            calls.append(
                ToolCallTrace(
                    tool=e.subject,
                    input=dict(e.inputs.get("input") or {}),
                    call_id=given if isinstance(given, str) else None,
                )
            )
        started, ended = result.started_at, result.ended_at
        gw = self.gateway.forget(job.id, attempt.index) if self.gateway else None
        tokens_in = summary.tokens_in if summary else 0
        tokens_out = summary.tokens_out if summary else 0
        cost = summary.cost_usd if summary else result.cost_usd
        if gw is not None:  # the gateway saw every model call as it happened
            g_in, g_out, g_cost = gw.totals()
            tokens_in, tokens_out = max(tokens_in, g_in), max(tokens_out, g_out)
            cost = g_cost if cost is None else max(cost, g_cost)
        event = AgentEvent(
            event_id=new_id(),
            job_id=job.id,
            attempt=attempt.index,
            at=self.clock(),
            role=job.role,
            worker=job.worker,
            tenant=job.tenant,
            session_id=(summary.session_id if summary else None) or _str(meta.get("session_id")),
            cli_version=_str(meta.get("cli_version")) or (summary.cli_version if summary else None),
            model=summary.model if summary else None,
            tool_calls=tuple(calls),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost,
            model_calls=gw.to_dict() if gw is not None else None,
            exit_code=result.exit_code,
            outcome=result.outcome.value,
            limit_hit=result.limit_hit,
            retry_count=attempt.index - 1,
            checkpoint_count=len(checkpoints),
            duration_ms=round((ended - started) * 1000) if started and ended else None,
            final_text=redactor.text(summary.final_text)[:4000]
            if summary and summary.final_text
            else None,
            error=redactor.text(result.error) if result.error else None,
        )
        await self.store.record_agent_event(event)

    async def resume_session(self, claimed: Claimed) -> str | None:
        """The session an agent attempt continues: its own job's, when the previous attempt was
        interrupted (lost with the engine or the host); else the one `--resume-from` names."""
        job = claimed.job
        if claimed.attempt.index > 1:
            attempts = await self.store.attempts(job.id)
            previous = [a for a in attempts if a.index == claimed.attempt.index - 1]
            if previous and previous[0].outcome is not None and previous[0].outcome.value == "lost":
                found = await self._last_session(job.id)
                if found:
                    return found
        earlier = job.options.resume_from
        return await self._last_session(earlier) if earlier else None

    async def _last_session(self, job_id: str) -> str | None:
        for cp in reversed(await self.store.checkpoints(job_id)):
            if cp.session_id:
                return cp.session_id
        for ev in reversed(await self.store.agent_events(job_id)):
            if ev.session_id:
                return ev.session_id
        return None


def _clip(value: Any) -> Any:
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= MAX_RECORDED_CHARS:
        return value
    return {"truncated": text[:MAX_RECORDED_CHARS]}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


NOTEBOOK_RECORD = "notebook.json"  # written by the notebook runner (workers/notebook.py)
NOTEBOOK_KEYS = ("path", "sha256", "parameters", "error")


TRAINING_RECORD = "training.json"  # written by the training runner (workers/training.py)
TRAINING_KEYS = ("method", "run_id", "run_file", "wandb_mode", "repo_id", "revision", "exit_code")


def _read_small_json(path: Path, limit: int = 256 * 1024) -> dict[str, Any]:
    try:
        if path.stat().st_size > limit:
            return {}
    except OSError:
        return {}
    return _read_json(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
