"""The order of the tool-call decision (policy/toolcall.py), table-tested like the pre-run
policy: for each pair of steps, a call that trips both gets the earlier step's verdict; the
approval settles only what a guardrail sent to a human, and a hook timeout has the last word.
The facts a step reads through the governor are asked for only when that step needs them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from corral.domain.governance import Approval, ApprovalState
from corral.domain.models import Limits
from corral.policy.guardrails import default_guardrails
from corral.policy.scopes import Call, Scope, Usage
from corral.policy.toolcall import STEPS, CallFacts, CallVerdict, Need, Step, counts, run

LIMITS = Limits(max_tool_calls=5, token_budget_in=1000, token_budget_out=100)
IN_SCOPE = Scope.parse(["Bash(kubectl *)", "Read"])
OUT_OF_SCOPE = Scope.parse(["Read"])  # kubectl is not in it
GUARDRAILS = default_guardrails()
FREE = "kubectl get pods"
DENIED = "kubectl delete pod trainer-0"  # the role's guardrail no-delete-running-jobs
TO_A_HUMAN = "kubectl scale deploy web --replicas=3"  # scaling-needs-approval

# What each step decides when it trips: (verdict, reason, decided_by).
TRIPPED = {
    Step.TOKEN_BUDGET: ("deny", "token_budget_in", "budget"),
    Step.TOOL_CALLS: ("deny", "max_tool_calls", "budget"),
    Step.SCOPE: ("deny", "out_of_scope", "scope"),
    Step.GUARDRAIL: ("deny", "destructive_on_running_jobs", "guardrail"),
    Step.BUDGET_CEILING: ("deny", "budget_ceiling", "budget"),
    Step.APPROVAL: ("deny", "approval_required", "guardrail"),
    Step.HOOK_TIMEOUT: ("deny", "hook_timeout", "timeout"),
}


def approval(state: ApprovalState) -> Approval:
    return Approval(
        id="a1",
        job_id="j",
        subject=TO_A_HUMAN,
        digest="d",
        reason="cluster_scaling",
        requested_at=0.0,
        expires_at=60.0,
        state=state,
        decided_by="ana",
    )


def facts(*trips: Step) -> CallFacts:
    """One call tripping exactly the steps named (every fact given: no step needs a read)."""
    command = (
        DENIED if Step.GUARDRAIL in trips else (TO_A_HUMAN if Step.APPROVAL in trips else FREE)
    )
    return CallFacts(
        call=Call(tool="Bash", input={"command": command}, workspace="/w"),
        role="notebook",
        scope=OUT_OF_SCOPE if Step.SCOPE in trips else IN_SCOPE,
        guardrails=GUARDRAILS,
        used=Usage(
            tool_calls=5 if Step.TOOL_CALLS in trips else 0,
            tokens_in=1000 if Step.TOKEN_BUDGET in trips else 0,
            tokens_out=0,
        ),
        limits=LIMITS,
        resolve=lambda p: p,
        cost_usd=2.5,
        over_ceiling=Step.BUDGET_CEILING in trips,
        approval=approval(ApprovalState.PENDING),
        late=Step.HOOK_TIMEOUT in trips,
    )


def decided(f: CallFacts) -> CallVerdict:
    out = run(f)
    assert isinstance(out, CallVerdict), out
    return out


def test_the_table_is_in_the_documented_order() -> None:
    assert [step for step, _check in STEPS] == list(Step)


def test_a_call_that_trips_nothing_is_allowed() -> None:
    v = decided(facts())
    assert (v.verdict, v.reason, v.decided_by, v.guardrail) == (
        "allow",
        "allowed",
        "scope",
        "kubectl-reads",
    )


@pytest.mark.parametrize("step", list(Step))
def test_each_step_alone(step: Step) -> None:
    v = decided(facts(step))
    assert (v.verdict, v.reason, v.decided_by) == TRIPPED[step], v.message


# A guardrail's deny and its require_approval are two different calls; and the ceiling holds
# only a call the scope and guardrails allow, so a call sent to a human is the approval's.
APART = {(Step.GUARDRAIL, Step.APPROVAL), (Step.BUDGET_CEILING, Step.APPROVAL)}
PAIRS = [(a, b) for a, b in itertools.combinations(list(Step)[:-1], 2) if (a, b) not in APART]


@pytest.mark.parametrize(("earlier", "later"), PAIRS)
def test_the_earlier_step_wins(earlier: Step, later: Step) -> None:
    v = decided(facts(earlier, later))
    assert (v.verdict, v.reason, v.decided_by) == TRIPPED[earlier], v.message


def test_a_call_sent_to_a_human_is_settled_by_the_approval_not_the_ceiling() -> None:
    f = facts(Step.BUDGET_CEILING, Step.APPROVAL)
    assert decided(f).reason == "approval_required"
    approved = decided(replace(f, approval=approval(ApprovalState.APPROVED)))
    assert (approved.verdict, approved.reason, approved.message) == (
        "allow",
        "approved",
        "approved by ana (a1)",
    )
    assert (
        decided(replace(f, approval=approval(ApprovalState.DENIED))).reason == "approval_rejected"
    )


@pytest.mark.parametrize("earlier", list(Step)[:-1])
def test_a_hook_timeout_has_the_last_word(earlier: Step) -> None:
    v = decided(facts(earlier, Step.HOOK_TIMEOUT))
    verdict, reason, _by = TRIPPED[earlier]
    assert (v.verdict, v.reason, v.decided_by, v.limit) == ("deny", "hook_timeout", "timeout", None)
    assert v.message.endswith(f"(the engine would have said {verdict}: {reason})")
    # the evaluation row keeps the stage of what the engine would have said
    assert v.stage == ("guardrail" if earlier in (Step.GUARDRAIL, Step.APPROVAL) else "tool_call")


def asked(f: CallFacts) -> list[str]:
    """The facts a run asks for, in order, each answered from ``f`` once asked."""
    unread = replace(f, over_ceiling=None, approval=None, late=None)
    out, seen = run(unread), []
    while isinstance(out, Need):
        seen.append(out.fact)
        unread = replace(unread, **{out.fact: getattr(f, out.fact)})
        out = run(unread, after=out)
    assert out == decided(f)
    return seen


@pytest.mark.parametrize(
    ("trips", "cost", "facts_asked"),
    [
        ((), 2.5, ["over_ceiling", "late"]),
        ((), 0.0, ["late"]),  # nothing spent: no ceiling to read
        ((Step.SCOPE,), 2.5, ["late"]),  # a call the scope denies costs no store read
        ((Step.TOOL_CALLS,), 2.5, ["late"]),
        ((Step.GUARDRAIL,), 2.5, ["late"]),
        ((Step.APPROVAL,), 2.5, ["approval", "late"]),
        ((Step.BUDGET_CEILING,), 2.5, ["over_ceiling", "late"]),
    ],
)
def test_a_step_asks_for_its_fact_only_when_it_needs_it(
    trips: tuple[Step, ...], cost: float, facts_asked: list[str]
) -> None:
    assert asked(replace(facts(*trips), cost_usd=cost)) == facts_asked


@pytest.mark.parametrize(
    ("trips", "use"),
    [
        ((), True),
        ((Step.SCOPE,), True),
        ((Step.GUARDRAIL,), True),
        ((Step.APPROVAL,), True),
        ((Step.TOKEN_BUDGET,), False),
        ((Step.TOOL_CALLS,), False),
        ((Step.BUDGET_CEILING,), False),
        ((Step.HOOK_TIMEOUT,), False),
    ],
)
def test_which_calls_are_a_use_of_the_budget(trips: tuple[Step, ...], use: bool) -> None:
    assert counts(decided(facts(*trips))) is use
