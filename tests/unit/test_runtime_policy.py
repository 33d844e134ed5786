"""The runtime policy on tool calls: budgets first, then the role's parsed scope."""

from __future__ import annotations

from typing import Any

import pytest

from corral.domain.models import Limits
from corral.policy.scopes import Call, Scope, Usage, decide

LIMITS = Limits(max_tool_calls=3, token_budget_in=1000, token_budget_out=100)
FRESH = Usage(tool_calls=0, tokens_in=0, tokens_out=0)
SCOPE = Scope.parse(["Bash(kubectl *)", "Bash(ray job *)", "Read", "Edit", "mcp__wandb"])
WORK = "/srv/work"


def call(tool: str, tool_input: dict[str, Any]) -> Call:
    return Call(tool=tool, input=tool_input, workspace=WORK)


def same(path: str) -> str:
    return path  # nothing on the way is a link


@pytest.mark.parametrize(
    ("tool", "tool_input", "verdict"),
    [
        ("Bash", {"command": "kubectl get pods -n ml"}, "allow"),
        ("bash", {"command": "ray job status raysubmit_1"}, "allow"),  # OpenCode spells it bash
        ("Bash", {"command": "ray stop"}, "deny"),
        ("Bash", {"command": "kubectl get pods && rm -rf /"}, "deny"),
        ("Bash", {"cmd": "kubectl get pods"}, "allow"),  # Codex's exec_command argument
        ("exec_command", {"cmd": "kubectl get pods"}, "allow"),
        ("Bash", {}, "deny"),
        ("Read", {"file_path": "/etc/passwd"}, "deny"),  # a bare Read is the workspace
        ("Read", {"file_path": f"{WORK}/notes.md"}, "allow"),
        ("read", {"filePath": "x"}, "allow"),
        (
            "apply_patch",
            {"command": "*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch"},
            "allow",
        ),  # Codex/OpenCode's Edit
        ("Write", {"file_path": "x"}, "deny"),
        ("WebFetch", {"url": "https://example.com"}, "deny"),
        ("mcp__wandb__list_runs", {}, "allow"),
        ("mcp__wandbx__list_runs", {}, "deny"),  # parsed by parts, not a string prefix
        ("mcp__github__create_issue", {}, "deny"),
    ],
)
def test_scope_decides_by_parsed_rules(
    tool: str, tool_input: dict[str, object], verdict: str
) -> None:
    d = decide(call(tool, tool_input), FRESH, LIMITS, SCOPE, same)
    assert d.verdict == verdict, d
    assert d.limit is None
    assert d.reason == ("allowed" if verdict == "allow" else "out_of_scope")


def test_budgets_come_before_scope_and_name_the_limit() -> None:
    bash = call("Bash", {"command": "kubectl get pods"})
    assert (
        decide(bash, Usage(tool_calls=2, tokens_in=0, tokens_out=0), LIMITS, SCOPE).verdict
        == "allow"
    )
    spent = decide(bash, Usage(tool_calls=3, tokens_in=0, tokens_out=0), LIMITS, SCOPE)
    assert (spent.verdict, spent.limit) == ("deny", "max_tool_calls")
    assert "summary" in spent.message
    tokens = decide(bash, Usage(tool_calls=0, tokens_in=0, tokens_out=100), LIMITS, SCOPE)
    assert (tokens.verdict, tokens.limit) == ("deny", "token_budget_out")
    both = decide(
        call("WebFetch", {}), Usage(tool_calls=0, tokens_in=1000, tokens_out=0), LIMITS, SCOPE
    )
    assert both.limit == "token_budget_in"


def test_an_empty_scope_allows_nothing_and_bad_rules_are_refused() -> None:
    assert decide(call("Read", {}), FRESH, LIMITS, Scope.parse([])).verdict == "deny"
    for bad in (
        "Bash(kubectl *",
        "(x)",
        "mcp__",
        "mcp__a__b__c",
        "Read(~/x)",
        "Write(../x)",
        "Read()",
    ):
        with pytest.raises(ValueError):
            Scope.parse([bad])


def test_a_call_the_engine_cannot_read_is_refused_after_the_budgets() -> None:
    unread = Call(
        tool="Bash",
        input={"command": "kubectl get pods"},
        workspace=WORK,
        problem="the call is not in Codex's session transcript",
    )
    d = decide(unread, FRESH, LIMITS, SCOPE)
    assert (d.verdict, d.reason) == ("deny", "out_of_scope") and "transcript" in d.message
    spent = decide(unread, Usage(tool_calls=3, tokens_in=0, tokens_out=0), LIMITS, SCOPE)
    assert spent.limit == "max_tool_calls"


@pytest.mark.parametrize(
    ("tool", "offered"),
    [
        ("Bash", True),
        ("exec_command", True),
        ("read", True),
        ("apply_patch", True),
        ("mcp__wandb__list_runs", True),
        ("Write", False),
        ("WebFetch", False),
        ("task", False),
        ("mcp__github__create_issue", False),
    ],
)
def test_a_scope_offers_a_tool_some_call_of_which_it_could_allow(tool: str, offered: bool) -> None:
    assert SCOPE.offers(tool) is offered
    assert Scope.parse([]).offers(tool) is False


def test_opencode_permission_denies_last_every_tool_the_scope_cannot_allow() -> None:
    from corral.workers.agents.opencode import OPENCODE_GATES, opencode_permission

    operator = {
        "*": "ask",
        "bash": {"*": "ask", "kubectl *": "allow"},
        "web*": "allow",
        "webfetch": "allow",
        "external_directory": "allow",
    }
    p = opencode_permission(SCOPE, operator)
    rules = list(p.items())
    assert rules[0] == ("*", "deny")
    allowed = {k for k, v in p.items() if v != "deny" and k in OPENCODE_GATES}
    assert allowed == {"bash", "read", "edit"}  # Edit's gate covers write and apply_patch
    assert p["bash"] == operator["bash"] and p["read"] == "ask"  # the operator refines
    assert p["external_directory"] == "allow"  # not a tool gate: the operator's call
    # every denied gate comes after any operator pattern that could re-open it
    denied = [i for i, (k, v) in enumerate(rules) if k in OPENCODE_GATES and v == "deny"]
    assert {rules[i][0] for i in denied} == OPENCODE_GATES.keys() - {"bash", "read", "edit"}
    assert min(denied) > max(i for i, (k, _) in enumerate(rules) if k == "web*")
    # a tool newer than the table is offered by the name the scope gives it
    assert opencode_permission(Scope.parse(["Lsp", "Scratchpad"]), None) == {
        "*": "deny",
        "lsp": "allow",
        "scratchpad": "allow",
        **{g: "deny" for g in OPENCODE_GATES if g != "lsp"},
    }


def test_opencode_permission_opens_the_mcp_tools_in_scope_by_opencodes_names() -> None:
    from corral.workers.agents.opencode import opencode_permission

    p = opencode_permission(
        Scope.parse(["mcp__wandb", "mcp__gh__list_issues"]), None, ["WandB", "gh"]
    )  # the servers as configured: OpenCode's spelling
    assert (p["WandB_*"], p["gh_list_issues"]) == ("allow", "allow")
    assert SCOPE.offers_server("wandb") and not SCOPE.offers_server("github")
