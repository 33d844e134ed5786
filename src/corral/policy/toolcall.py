"""The one decision on a tool call: budgets, then the role's tool scope, then its guardrails.

The engine's governor (runtime/governor.py) and `corral guard check` both call `decide`, so an
operator trying a command sees exactly what an agent of that role would get, and which part
decided it: ``budget`` (a runtime limit is spent: the attempt is stopped after a grace),
``scope`` (the tool, the command, a path or a redirection is outside the role's scope, or the
command cannot be verified), or ``guardrail`` (a rule of the role, or a built-in hold such as
code installed on a cluster, denies it or needs a human). An allowed call names the scope rule
that allowed it and the guardrail rule, if any, that had the last word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from corral.domain.models import Limits
from corral.policy.guardrails import Guardrails, GuardVerdictKind
from corral.policy.paths import Resolve, real
from corral.policy.scopes import Call, Scope, Usage
from corral.policy.scopes import decide as decide_scope

__all__ = ["CallVerdict", "DecidedBy", "decide"]

DecidedBy = Literal["budget", "scope", "guardrail", "timeout"]


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


def decide(call: Call, *, role: str, scope: Scope, guardrails: Guardrails, used: Usage,
           limits: Limits, resolve: Resolve = real) -> CallVerdict:
    """The verdict on one tool call of an agent of ``role`` (pure, given ``resolve``)."""
    d = decide_scope(call, used, limits, scope, resolve)
    if d.verdict != "allow":
        return CallVerdict(verdict="deny", reason=d.reason, message=d.message,
                           decided_by="budget" if d.limit else "scope", limit=d.limit)
    g = guardrails.evaluate(role, "tool_call", call.tool, call.input, call.shell)
    if g.verdict == "allow":
        return CallVerdict(verdict="allow", reason=d.reason, message=d.message,
                           decided_by="scope", rule=d.rule, guardrail=g.rule_id)
    return CallVerdict(verdict=g.verdict, reason=g.reason, message=g.message,
                       decided_by="guardrail", rule=g.rule_id,
                       approval_subject=g.approval_subject, command=g.command)
