"""The one decision on a tool call: a table of pure steps, like the pre-run policy (prerun.py).

The engine's governor (runtime/governor.py) runs every step; `corral guard check` runs `decide`,
the steps a role's rules alone settle, so an operator trying a command sees exactly what an
agent of that role would get, and which part decided it. The steps, in order:

1. `token_budget`   the attempt's input or output tokens reached the job's budget
                    → deny / token_budget_in | token_budget_out, decided by ``budget``
2. `tool_calls`     the calls asked for so far reached max_tool_calls
                    → deny / max_tool_calls, decided by ``budget``
3. `scope`          the tool, the command, a path or a redirection is outside the role's scope,
                    or the engine cannot tell how the CLI will run the call
                    → deny / out_of_scope; else allow / allowed (names the scope rule)
4. `guardrail`      a rule of the role, or a built-in hold such as code installed on a cluster,
                    denies the call or needs a human → its verdict and reason; an allowed call
                    names the guardrail rule, if any, that had the last word
5. `budget_ceiling` an allowed call of an attempt whose running cost crosses a budget ceiling
                    → deny / budget_ceiling, decided by ``budget``
6. `approval`       a call a guardrail sends to a human: allow / approved once a human approved
                    exactly this action for this job; else deny / approval_required (pending) or
                    approval_rejected
7. `hook_timeout`   the hook gave up waiting before the verdict and denied the call itself
                    → deny / hook_timeout, decided by ``timeout``; the message says what the
                    engine would have said

A budget step (1, 2, 5) names the runtime limit reached (`limit`): the attempt is stopped after
its summary grace. The first step that denies decides, except that an approval only settles what
a guardrail sent to a human, and a hook timeout is the last word on any verdict (it is what
really happened to the call).

Three facts cost the governor a read (the store, or the clock after every other await), so a
step asks for its fact only when it needs it (`Need`), and the governor reads it and resumes
(`run(facts, after=need)`): a call the scope denies costs no store read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from corral.domain.governance import Approval, ApprovalState
from corral.domain.models import Limits
from corral.policy.guardrails import STRICTNESS, Guardrails, GuardVerdictKind
from corral.policy.paths import Resolve, real
from corral.policy.prerun import BUDGET_CEILING_LIMIT
from corral.policy.scopes import Call, Decision, Scope, Usage, call_limit, in_scope, token_limit

__all__ = [
    "HOOK_TIMEOUT",
    "STEPS",
    "CallFacts",
    "CallVerdict",
    "DecidedBy",
    "Need",
    "Step",
    "counts",
    "decide",
    "run",
]

DecidedBy = Literal["budget", "scope", "guardrail", "timeout"]
Fact = Literal["over_ceiling", "approval", "late"]
# A call the hook denied by its own timeout before the engine answered: recorded, never a use.
HOOK_TIMEOUT = "hook_timeout"


class Step(StrEnum):
    """The per-call steps, in order (module docstring)."""

    TOKEN_BUDGET = "token_budget"
    TOOL_CALLS = "tool_calls"
    SCOPE = "scope"
    GUARDRAIL = "guardrail"
    BUDGET_CEILING = "budget_ceiling"
    APPROVAL = "approval"
    HOOK_TIMEOUT = "hook_timeout"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallVerdict:
    verdict: GuardVerdictKind
    reason: str  # machine code: allowed | out_of_scope | max_tool_calls | a guardrail's reason
    message: str  # for the agent (a denial's text reaches the model) and for people
    decided_by: DecidedBy
    rule: str | None = None  # the scope rule (allowed by scope) or the guardrail rule
    guardrail: str | None = None  # the guardrail rule that allowed an allowed call, if any
    limit: str | None = None  # the runtime limit reached
    approval_subject: str | None = None  # require_approval: exactly what a human approves
    command: str | None = None  # the simple command (or SQL) a guardrail verdict is about
    stage: Literal["tool_call", "guardrail"] = "tool_call"  # the evaluation row's stage


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFacts:
    """Everything the steps read. The last three are read by the governor when a step asks
    (None: not read yet); `decide` gives the answers of a call outside any run."""

    call: Call
    role: str
    scope: Scope
    guardrails: Guardrails
    used: Usage
    limits: Limits
    resolve: Resolve = real
    cost_usd: float = 0.0  # the attempt's running cost
    over_ceiling: bool | None = None  # does cost_usd cross a budget ceiling of the job?
    approval: Approval | None = None  # the latest approval of the verdict's approval subject
    late: bool | None = None  # had the hook given up waiting when the verdict was reached?
    also: tuple[str, ...] = ()  # guardrail roles applied besides `role` (`_epic_worker`)


@dataclass(frozen=True, slots=True, kw_only=True)
class Need:
    """The step `at` cannot go on without `fact`: read it into the facts, then `run(…, after=)`.
    ``so_far``: the verdict of the steps before (the approval subject, for an approval)."""

    fact: Fact
    so_far: CallVerdict
    at: int = 0


_StepFn = Callable[[CallFacts, CallVerdict | None], CallVerdict | Need | None]


def _verdict(d: Decision | None) -> CallVerdict | None:
    if d is None:
        return None
    return CallVerdict(
        verdict="allow" if d.verdict == "allow" else "deny",
        reason=d.reason,
        message=d.message,
        limit=d.limit,
        rule=d.rule,
        decided_by="budget" if d.limit else "scope",
    )


def _token_budget(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | None:
    return _verdict(token_limit(f.used, f.limits)) if so_far is None else None


def _tool_calls(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | None:
    return _verdict(call_limit(f.used, f.limits)) if so_far is None else None


def _scope(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | None:
    return _verdict(in_scope(f.call, f.scope, f.resolve)) if so_far is None else None


def _guardrail(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | None:
    if so_far is None or so_far.verdict != "allow":
        return None
    c = f.call
    g = f.guardrails.evaluate(f.role, "tool_call", c.tool, c.input, c.shell)
    for extra in f.also:  # the strictest verdict wins, as between a role's rules and `_all`'s
        more = f.guardrails.evaluate(extra, "tool_call", c.tool, c.input, c.shell)
        if STRICTNESS[more.verdict] > STRICTNESS[g.verdict]:
            g = more
    if g.verdict == "allow":
        return replace(so_far, guardrail=g.rule_id)
    return CallVerdict(
        verdict=g.verdict,
        reason=g.reason,
        message=g.message,
        decided_by="guardrail",
        rule=g.rule_id,
        stage="guardrail",
        approval_subject=g.approval_subject,
        command=g.command,
    )


def _budget_ceiling(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | Need | None:
    if so_far is None or so_far.verdict != "allow" or not f.cost_usd:
        return None
    if f.over_ceiling is None:
        return Need(fact="over_ceiling", so_far=so_far)
    if not f.over_ceiling:
        return None
    return CallVerdict(
        verdict="deny",
        reason=BUDGET_CEILING_LIMIT,
        limit=BUDGET_CEILING_LIMIT,
        decided_by="budget",
        message=f"Corral: this run has cost ${f.cost_usd:.4f} so far, which crosses its "
        "budget ceiling. Make no more tool calls: write your summary and stop.",
    )


def _approval(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | Need | None:
    if so_far is None or so_far.verdict != "require_approval":
        return None
    a = f.approval
    if a is None:  # the governor reads it, and files the request when there is none yet
        return Need(fact="approval", so_far=so_far)
    subject = so_far.approval_subject or ""
    if a.state is ApprovalState.APPROVED:
        return replace(
            so_far,
            verdict="allow",
            reason="approved",
            message=f"approved by {a.decided_by} ({a.id})",
        )
    if a.state is ApprovalState.PENDING:
        return replace(
            so_far,
            verdict="deny",
            reason="approval_required",
            message=(
                f"Corral: `{subject}` needs a human's approval ({so_far.message}); request "
                f"{a.id} is waiting. Do not work around it: do something else or stop, "
                "and retry exactly this command only once it is approved."
            ),
        )
    return replace(
        so_far,
        verdict="deny",
        reason="approval_rejected",
        message=f"Corral: `{subject}` was not approved ({a.id}, {a.state.value}).",
    )


def _hook_timeout(f: CallFacts, so_far: CallVerdict | None) -> CallVerdict | Need | None:
    if so_far is None:
        return None
    if f.late is None:  # read last: after every other read the decision waited for
        return Need(fact="late", so_far=so_far)
    if not f.late:
        return None
    return CallVerdict(
        verdict="deny",
        reason=HOOK_TIMEOUT,
        decided_by="timeout",
        stage=so_far.stage,
        message="the hook gave up waiting for the engine and denied the call "
        f"(the engine would have said {so_far.verdict}: {so_far.reason})",
    )


STEPS: tuple[tuple[Step, _StepFn], ...] = (
    (Step.TOKEN_BUDGET, _token_budget),
    (Step.TOOL_CALLS, _tool_calls),
    (Step.SCOPE, _scope),
    (Step.GUARDRAIL, _guardrail),
    (Step.BUDGET_CEILING, _budget_ceiling),
    (Step.APPROVAL, _approval),
    (Step.HOOK_TIMEOUT, _hook_timeout),
)


def run(facts: CallFacts, *, after: Need | None = None) -> CallVerdict | Need:
    """The verdict on one call, or the fact the next step needs first. ``after``: resume at the
    step that asked, with the fact now in ``facts``. Pure."""
    start, so_far = (after.at, after.so_far) if after is not None else (0, None)
    for at, (_step, check) in enumerate(STEPS[start:], start):
        out = check(facts, so_far)
        if isinstance(out, Need):
            return replace(out, at=at)
        if out is not None:
            so_far = out
    assert so_far is not None  # the scope step decides every call that reaches it
    return so_far


def decide(
    call: Call,
    *,
    role: str,
    scope: Scope,
    guardrails: Guardrails,
    used: Usage,
    limits: Limits,
    resolve: Resolve = real,
    also: tuple[str, ...] = (),
) -> CallVerdict:
    """The verdict of a role's rules alone on one call of an agent of ``role``, outside any run
    (no cost spent, no hook waiting): a call a guardrail sends to a human stays
    require_approval. What `corral guard check` shows. Pure, given ``resolve``; ``also``: the
    guardrail roles applied besides ``role`` (`_epic_worker` for an epic's worker)."""
    out = run(
        CallFacts(
            call=call,
            role=role,
            scope=scope,
            guardrails=guardrails,
            used=used,
            limits=limits,
            resolve=resolve,
            over_ceiling=False,
            late=False,
            also=also,
        )
    )
    return out.so_far if isinstance(out, Need) else out


def counts(v: CallVerdict) -> bool:
    """Whether a decided call is a use of the tool-call budget: a call refused for scope or by
    a guardrail counts too (an agent looping on refused calls must reach its limit); a budget
    denial, and a call the hook had already denied by its timeout, do not."""
    return v.limit is None and v.reason != HOOK_TIMEOUT
