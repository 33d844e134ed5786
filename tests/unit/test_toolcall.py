"""The one decision on a tool call (policy/toolcall.py): budgets, then scope, then guardrails,
and which part decided — what the governor and `corral guard check` both run."""

from __future__ import annotations

from typing import Any

import pytest

from corral.domain.models import Limits
from corral.policy.guardrails import default_guardrails
from corral.policy.scopes import Call, Scope, Usage
from corral.policy.toolcall import decide

SCOPE = Scope.parse(["Bash(kubectl *)", "Bash(ray job submit *)", "Bash(python *)", "Read"])
LIMITS = Limits(max_tool_calls=5)
FRESH = Usage(tool_calls=0, tokens_in=0, tokens_out=0)


def bash(command: str, used: Usage = FRESH, shell: str = "bash") -> Any:
    return decide(
        Call(tool="Bash", input={"command": command}, workspace="/w", shell=shell),
        role="notebook",
        scope=SCOPE,
        guardrails=default_guardrails(),
        used=used,
        limits=LIMITS,
        resolve=lambda p: p,
    )


@pytest.mark.parametrize(
    ("command", "verdict", "reason", "by", "rule"),
    [
        (
            "kubectl get pods",
            "allow",
            "allowed",
            "scope",
            "Bash(kubectl * | ray job submit * | python *)",
        ),
        ("rm -rf /", "deny", "out_of_scope", "scope", None),
        ("kubectl get pods > ~/.bashrc", "deny", "out_of_scope", "scope", None),
        (
            "kubectl delete pod trainer-0",
            "deny",
            "destructive_on_running_jobs",
            "guardrail",
            "no-delete-running-jobs",
        ),
        (
            "kubectl scale deploy web --replicas=3",
            "require_approval",
            "cluster_scaling",
            "guardrail",
            "scaling-needs-approval",
        ),
        ("kubectl get secret db -o yaml", "deny", "sensitive_read", "guardrail", "no-secret-reads"),
        (
            'ray job submit --runtime-env-json \'{"pip": ["x"]}\' -- python t.py',
            "require_approval",
            "installs_code",
            "guardrail",
            None,
        ),
    ],
)
def test_which_part_decides(
    command: str, verdict: str, reason: str, by: str, rule: str | None
) -> None:
    v = bash(command)
    assert (v.verdict, v.reason, v.decided_by, v.rule) == (verdict, reason, by, rule), v.message


def test_an_allowed_call_names_the_guardrail_that_had_the_last_word() -> None:
    assert bash("kubectl get pods").guardrail == "kubectl-reads"
    assert bash("python train.py").guardrail is None


def test_budgets_decide_first() -> None:
    v = bash("kubectl delete pod x", Usage(tool_calls=5, tokens_in=0, tokens_out=0))
    assert (v.verdict, v.decided_by, v.limit) == ("deny", "budget", "max_tool_calls")


def test_an_approval_binds_the_exact_command() -> None:
    v = bash("kubectl scale deploy web --replicas=3  ")
    assert v.approval_subject == "kubectl scale deploy web --replicas=3"


def test_the_shell_changes_the_verdict() -> None:
    command = "kubectl get pods &>/dev/null kubectl delete pod x"
    # bash: one command, `kubectl get pods kubectl delete pod x`, with its output discarded
    assert (bash(command).verdict, bash(command).guardrail) == ("allow", "kubectl-reads")
    v = bash(command, shell="sh")
    assert (v.verdict, v.decided_by) == ("deny", "scope") and "runs under sh" in v.message


@pytest.mark.parametrize(
    ("command", "verdict"),
    [
        ("git status", "allow"),
        ("git diff HEAD", "allow"),
        ("git commit -am done", "deny"),
        ("git -C . commit -m x", "deny"),
        ("git push origin HEAD", "deny"),
        ("sh -c 'git push'", "deny"),
    ],
)
def test_an_epic_worker_may_not_commit(command: str, verdict: str) -> None:
    """Seed 002's lead-only commits: `_epic_worker`'s rules apply besides the role's."""

    def check(also: tuple[str, ...]) -> Any:
        return decide(
            Call(tool="Bash", input={"command": command}, workspace="/w"),
            role="coder",
            scope=Scope.parse(["Bash(git *)", "Bash(sh *)"]),
            guardrails=default_guardrails(),
            used=FRESH,
            limits=LIMITS,
            resolve=lambda p: p,
            also=also,
        )

    assert check(()).verdict == "allow"  # outside an epic the role's rules alone decide
    v = check(("_epic_worker",))
    assert v.verdict == verdict
    if verdict == "deny":
        assert (v.reason, v.rule) == ("lead_only_commits", "epic-no-commit")
