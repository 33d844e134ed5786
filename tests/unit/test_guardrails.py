"""Guardrails: per-role rules as data, checked against what the shell (or the database) would run;
options are parsed, never grepped; a flag an agent types is never consent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.policy.guardrails import (
    Guardrails,
    approval_digest,
    default_guardrails,
    load_rules,
)

DEFAULTS = default_guardrails()


def bash(
    role: str, command: str | list[str], stage: str = "tool_call", rules: Guardrails = DEFAULTS
) -> tuple[str, str, str | None]:
    v = rules.evaluate(role, stage, "Bash", {"command": command})
    return v.verdict, v.reason, v.rule_id


# --------------------------------------------------------------------------------------------
# The shipped defaults
# --------------------------------------------------------------------------------------------

DEFAULT_CASES = [
    # NotebookAgent: no `kubectl delete` of running workloads, however it is spelled
    (
        "notebook",
        "kubectl delete pod trainer-0",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    (
        "notebook",
        "kubectl delete pods/trainer-0",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    (
        "notebook",
        "kubectl -n ml delete job train",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    (
        "notebook",
        "kubectl --namespace=ml delete rayjob r1",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    (
        "notebook",
        "/usr/local/bin/kubectl delete raycluster c",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    ("notebook", "sudo kubectl delete po x", "deny", "unverifiable_command", None),
    (
        "notebook",
        "sh -c 'kubectl delete deploy x'",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    (
        "notebook",
        "kubectl get pods && kubectl delete pod x",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    ),
    (
        "notebook",
        "kubectl get pods -o name | xargs kubectl delete",
        "deny",
        "unverifiable_command",
        "no-delete-running-jobs",
    ),  # the words come at run time
    (
        "notebook",
        "ls | xargs kubectl get",
        "deny",
        "unverifiable_command",
        "redirect-kubectl",
    ),  # …and could be `--context=…`
    ("notebook", "ls | xargs git add", "allow", "no_rule_matched", None),
    (
        "notebook",
        "kubectl delete -f job.yaml",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-unknown-target",
    ),
    (
        "notebook",
        "kubectl delete --all cm",
        "deny",
        "destructive_on_running_jobs",
        "no-delete-unknown-target",
    ),
    (
        "notebook",
        "kubectl delete configmap settings",
        "require_approval",
        "kubectl_delete",
        "delete-needs-approval",
    ),
    (
        "notebook",
        "ray job stop raysubmit_1",
        "deny",
        "destructive_on_running_jobs",
        "no-stop-ray-jobs",
    ),
    # …and scaling needs a human
    (
        "notebook",
        "kubectl scale deploy web --replicas=3",
        "require_approval",
        "cluster_scaling",
        "scaling-needs-approval",
    ),
    (
        "notebook",
        "ray up cluster.yaml",
        "require_approval",
        "cluster_scaling",
        "scaling-needs-approval",
    ),
    (
        "notebook",
        "ray up -y cluster.yaml",
        "require_approval",
        "cluster_scaling",
        "scaling-needs-approval",
    ),
    (
        "notebook",
        """kubectl patch rc web -p '{"spec":{"replicas":5}}'""",
        "require_approval",
        "cluster_scaling",
        "patch-replicas-needs-approval",
    ),
    (
        "notebook",
        """kubectl patch deploy web --patch='{"spec":{"replicas":5}}'""",
        "require_approval",
        "cluster_scaling",
        "patch-replicas-needs-approval",
    ),
    (
        "notebook",
        """kubectl patch deploy web -p '{"metadata":{"labels":{"a":"b"}}}'""",
        "allow",
        "no_rule_matched",
        None,
    ),
    ("notebook", "kubectl get pods", "allow", "read_only", "kubectl-reads"),
    ("notebook", "git status", "allow", "no_rule_matched", None),
    # ClusterAgent: helm uninstall needs approval, whatever flag is typed
    (
        "cluster",
        "helm uninstall web",
        "require_approval",
        "helm_uninstall",
        "helm-uninstall-needs-approval",
    ),
    (
        "cluster",
        "helm uninstall web --force",
        "require_approval",
        "helm_uninstall",
        "helm-uninstall-needs-approval",
    ),
    (
        "cluster",
        "helm uninstall web force=true --yes --no-hooks",
        "require_approval",
        "helm_uninstall",
        "helm-uninstall-needs-approval",
    ),
    (
        "cluster",
        "helm del web",
        "require_approval",
        "helm_uninstall",
        "helm-uninstall-needs-approval",
    ),
    ("cluster", "helm list -A", "allow", "read_only", "helm-reads"),
    ("cluster", "helm upgrade web chart/ -n ml", "allow", "no_rule_matched", None),
    # WandBAgent: read-only, never deletes runs
    ("wandb", "wandb status", "allow", "read_only", "wandb-reads"),
    ("wandb", "wandb --version", "allow", "read_only", "wandb-reads"),
    ("wandb", "wandb artifact ls team/proj", "allow", "read_only", "wandb-reads"),
    ("wandb", "wandb artifact rm team/proj/model:v1", "deny", "run_deletion", "no-run-deletion"),
    ("wandb", "wandb sync --clean", "deny", "run_deletion", "no-sync-clean"),
    ("wandb", "wandb sync --clean-old-hours=1", "deny", "run_deletion", "no-sync-clean"),
    ("wandb", "wandb sync ./wandb/run-1", "deny", "read_only_role", "wandb-read-only"),
    ("wandb", "wandb artifact put model.pt", "deny", "read_only_role", "wandb-read-only"),
    (
        "wandb",
        "python -c 'import wandb; wandb.Api().run(\"e/p/r\").delete()'",
        "deny",
        "unverifiable_command",
        "no-python-c",
    ),
    ("wandb", "cat job.py | python3 -", "deny", "unverifiable_command", "no-python-stdin"),
    ("wandb", "python3 < job.py", "deny", "unverifiable_command", "no-python-stdin"),
    (
        "wandb",
        "curl -X DELETE https://api.wandb.ai/runs/x",
        "deny",
        "read_only_role",
        "no-http-writes",
    ),
    (
        "wandb",
        "curl -XDELETE https://api.wandb.ai/runs/x",
        "deny",
        "read_only_role",
        "no-http-writes",
    ),
    (
        "wandb",
        "curl --request=delete https://api.wandb.ai/runs/x",
        "deny",
        "read_only_role",
        "no-http-writes",
    ),
    (
        "wandb",
        "curl -sd '{}' https://api.wandb.ai/graphql",
        "deny",
        "read_only_role",
        "no-http-uploads",
    ),
    ("wandb", "curl -s https://api.wandb.ai/runs/x", "allow", "no_rule_matched", None),
    ("wandb", "python -m json.tool out.json", "allow", "python_module", "python-module"),
    # LakehouseAgent: SQL is parsed, production tables protected
    (
        "lakehouse",
        "duckdb -c 'DROP TABLE prod.sales'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb lake.duckdb 'DELETE FROM prod.sales'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb prod.duckdb -c 'DROP TABLE sales'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb -readonly lake.duckdb -c 'DELETE FROM prod.s WHERE id = 1'",
        "require_approval",
        "sql_delete_protected",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb lake.duckdb -c 'SELECT * FROM prod.sales'",
        "allow",
        "sql_allowed",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb lake.duckdb -c 'SELECT 1' -c 'DROP TABLE prod.x'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb lake.duckdb -c 'SELECT 1; DROP TABLE dev.x'",
        "deny",
        "sql_multiple_statements",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "duckdb lake.duckdb < cleanup.sql",
        "deny",
        "unverifiable_sql",
        "protect-prod-duckdb",
    ),
    (
        "lakehouse",
        "echo 'DROP TABLE prod.x' | duckdb lake.duckdb",
        "deny",
        "unverifiable_sql",
        "protect-prod-duckdb",
    ),
    ("lakehouse", "duckdb -init evil.sql lake.duckdb", "deny", "unverifiable_sql", "no-sql-files"),
    (
        "lakehouse",
        "duckdb lake.duckdb -c '.shell rm -rf /'",
        "deny",
        "sql_unsupported",
        "protect-prod-duckdb",
    ),
    ("lakehouse", "duckdb lake.duckdb -c '.tables'", "allow", "sql_allowed", "protect-prod-duckdb"),
    (
        "lakehouse",
        "psql -d prod -c 'DROP TABLE sales'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-psql",
    ),
    ("lakehouse", "psql -f cleanup.sql", "deny", "unverifiable_sql", "no-sql-files"),
    (
        "lakehouse",
        "spark-sql -e 'TRUNCATE TABLE prod.sales'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-spark-sql",
    ),
    (
        "lakehouse",
        "sqlite3 prod.db 'DELETE FROM sales'",
        "deny",
        "sql_destructive_protected",
        "protect-prod-sqlite",
    ),
    (
        "lakehouse",
        "python -c 'import duckdb; duckdb.sql(\"DROP TABLE prod.x\")'",
        "deny",
        "unverifiable_command",
        "no-python-c",
    ),
    ("lakehouse", "python etl.py", "allow", "no_rule_matched", None),
    # every role: redirecting options and variables, protected namespaces
    (
        "notebook",
        "kubectl get pods --context=prod-admin",
        "deny",
        "tool_redirected",
        "redirect-kubectl",
    ),
    (
        "notebook",
        "kubectl get pods --context prod-admin",
        "deny",
        "tool_redirected",
        "redirect-kubectl",
    ),
    (
        "cluster",
        "kubectl --kubeconfig /tmp/other get pods",
        "deny",
        "tool_redirected",
        "redirect-kubectl",
    ),
    ("cluster", "helm list --kube-context=other", "deny", "tool_redirected", "redirect-helm"),
    (
        "nobody",
        "ray job submit --address http://other:8265 -- python x.py",
        "deny",
        "tool_redirected",
        "redirect-ray",
    ),
    ("nobody", "KUBECONFIG=/tmp/other kubectl get pods", "deny", "tool_redirected", "redirect-env"),
    (
        "nobody",
        "export KUBECONFIG=/tmp/other; kubectl get pods",
        "deny",
        "tool_redirected",
        "redirect-env",
    ),
    ("nobody", "env RAY_ADDRESS=http://x ray status", "deny", "tool_redirected", "redirect-env"),
    (
        "nobody",
        "kubectl apply -f x.yaml -n kube-system",
        "require_approval",
        "protected_namespace",
        "protected-namespace",
    ),
    (
        "nobody",
        "kubectl apply -f x.yaml -nkube-system",
        "require_approval",
        "protected_namespace",
        "protected-namespace",
    ),
    (
        "nobody",
        "kubectl apply -f x.yaml --namespace=kube-system",
        "require_approval",
        "protected_namespace",
        "protected-namespace",
    ),
    (
        "nobody",
        "kubectl apply -f x.yaml --namespace kube-system",
        "require_approval",
        "protected_namespace",
        "protected-namespace",
    ),
    ("nobody", "kubectl apply -f x.yaml -n ml", "allow", "no_rule_matched", None),
    ("nobody", "kubectl logs web-0 -n kube-system", "allow", "read_only", "kubectl-reads"),
    (
        "nobody",
        "helm install web chart -n prod",
        "require_approval",
        "protected_namespace",
        "protected-namespace",
    ),
    # an unknown role gets only the `_all` rules
    ("nobody", "kubectl delete pod x", "allow", "no_rule_matched", None),
    # options are parsed, not grepped: these are values/operands, not the options
    ("nobody", "kubectl apply -f kube-system.yaml", "allow", "no_rule_matched", None),
    ("nobody", "echo --context=prod", "allow", "no_rule_matched", None),
    ("nobody", "kubectl get cm --selector=app=kube-system", "allow", "read_only", "kubectl-reads"),
    # what the parser cannot account for is refused
    ("nobody", "echo $(kubectl delete pod x)", "deny", "unverifiable_command", None),
    ("nobody", "kubectl $VERB pod x", "deny", "unverifiable_command", None),
    ("nobody", "ls 'unterminated", "deny", "unverifiable_command", None),
]


@pytest.mark.parametrize(("role", "command", "verdict", "reason", "rule"), DEFAULT_CASES)
def test_default_guardrails(
    role: str, command: str, verdict: str, reason: str, rule: str | None
) -> None:
    assert bash(role, command) == (verdict, reason, rule)


def test_the_role_list_cannot_lift_an_all_rule() -> None:
    rules = load_rules("""
roles:
  ops:
    - {id: anything-goes, when: {command: "kubectl *"}, verdict: allow, reason: trusted}
  _all:
    - {id: no-context, when: {command: "kubectl *", option: [--context]}, verdict: deny,
       reason: tool_redirected}
""")
    assert bash("ops", "kubectl get pods", rules=rules) == ("allow", "trusted", "anything-goes")
    assert bash("ops", "kubectl get pods --context x", rules=rules) == (
        "deny",
        "tool_redirected",
        "no-context",
    )


def test_first_matching_rule_decides_each_command() -> None:
    rules = load_rules("""
roles:
  r:
    - {id: first, when: {command: "kubectl get *"}, verdict: allow, reason: reads}
    - {id: second, when: {command: "kubectl *"}, verdict: deny, reason: writes}
""")
    assert bash("r", "kubectl get pods", rules=rules) == ("allow", "reads", "first")
    assert bash("r", "kubectl apply -f x", rules=rules) == ("deny", "writes", "second")
    # the strictest verdict over every command wins
    assert bash("r", "kubectl get pods; kubectl apply -f x", rules=rules) == (
        "deny",
        "writes",
        "second",
    )


AMBIGUOUS = """
roles:
  r:
    - {id: ok, when: {command: "tool read *"}, verdict: allow, reason: reads}
    - {id: no-delete, when: {command: "tool delete *"}, verdict: deny, reason: deletes}
"""


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        # `--opt` is unknown: `delete` may be its value or the subcommand; a deny rule assumes
        # either
        ("tool --opt delete x", ("deny", "deletes", "no-delete")),
        ("tool --opt x delete y", ("deny", "deletes", "no-delete")),
        ("tool --opt=x delete y", ("deny", "deletes", "no-delete")),
        # …while an allow rule matches only an unambiguous command
        ("tool read x", ("allow", "reads", "ok")),
        ("tool --opt=1 read x", ("allow", "reads", "ok")),
        ("tool --opt read x", ("allow", "no_rule_matched", None)),
        ("tool -- delete x", ("deny", "deletes", "no-delete")),
    ],
)
def test_unknown_options_are_read_both_ways(
    command: str, expected: tuple[str, str, str | None]
) -> None:
    assert bash("r", command, rules=load_rules(AMBIGUOUS)) == expected


def test_combined_short_flags() -> None:
    rules = load_rules("""
programs:
  tool: {valued: [-n]}
roles:
  r:
    - {id: yes-flag, when: {command: "tool *", option: [-y]}, verdict: deny, reason: said_yes}
    - {id: ns, when: {command: "tool *", option_value: {-n: [prod]}}, verdict: deny,
       reason: ns}
""")
    assert bash("r", "tool -fy x", rules=rules) == ("deny", "said_yes", "yes-flag")
    assert bash("r", "tool -fnprod x", rules=rules) == ("deny", "ns", "ns")
    assert bash("r", "tool -ny x", rules=rules) == ("allow", "no_rule_matched", None)  # -n's value


# --------------------------------------------------------------------------------------------
# Approval: bound to the exact command; flags are not consent
# --------------------------------------------------------------------------------------------


def test_require_approval_carries_the_exact_command() -> None:
    v = DEFAULTS.evaluate(
        "cluster", "tool_call", "Bash", {"command": "  helm uninstall web --force  "}
    )
    assert v.verdict == "require_approval"
    assert v.approval_subject == "helm uninstall web --force"
    assert v.command == "helm uninstall web --force"
    assert "`--force` is not consent" in v.message
    other = DEFAULTS.evaluate("cluster", "tool_call", "Bash", {"command": "helm uninstall web"})
    assert other.approval_subject == "helm uninstall web"
    assert approval_digest(v.approval_subject) != approval_digest(other.approval_subject or "")


def test_argv_input_is_quoted_word_by_word() -> None:
    argv = ["helm", "uninstall", "web; rm -rf /"]
    v = DEFAULTS.evaluate("cluster", "spawn", "Bash", {"command": argv})
    assert v.verdict == "require_approval"
    assert v.approval_subject == "helm uninstall 'web; rm -rf /'"


def test_approval_digest_is_sha256_hex() -> None:
    assert approval_digest("helm uninstall web") == (
        "5265c2237d7aee3c9d92f7236d06773381696a96359fac6780a80036bd7df35d"
    )
    assert approval_digest("helm uninstall web ") != approval_digest("helm uninstall web")


def test_allow_and_deny_carry_no_approval_subject() -> None:
    assert (
        DEFAULTS.evaluate(
            "notebook", "tool_call", "Bash", {"command": "kubectl delete pod x"}
        ).approval_subject
        is None
    )
    assert (
        DEFAULTS.evaluate(
            "notebook", "tool_call", "Bash", {"command": "kubectl get pods"}
        ).approval_subject
        is None
    )


@pytest.mark.parametrize(
    "when",
    [
        '{command: "helm uninstall *", option: [--force]}',
        '{command: "helm uninstall *", option: [--yes]}',
        '{command: "helm uninstall * force=true"}',
        '{command: "helm uninstall *", option: [--really]}',  # declared by the rule below
    ],
)
def test_an_allow_rule_cannot_depend_on_a_typed_flag(when: str) -> None:
    text = f"""
roles:
  cluster:
    - id: loophole
      when: {when}
      verdict: allow
      reason: forced
    - id: uninstall
      when: {{command: "helm uninstall *"}}
      verdict: require_approval
      reason: helm_uninstall
      force_flags: [--really]
"""
    with pytest.raises(ValueError, match=r"roles\.cluster\[0\]: an allow rule cannot depend"):
        load_rules(text)


# --------------------------------------------------------------------------------------------
# Stages, tools, SQL tools
# --------------------------------------------------------------------------------------------

STAGED = """
roles:
  r:
    - {id: spawn-only, when: {stage: spawn, command: "make *"}, verdict: deny, reason: no_make}
    - {id: write-etc, when: {tool: Write, input: {file_path: ["/etc/*"]}}, verdict: deny,
       reason: system_file}
    - {id: sql-tool, when: {tool: "mcp__db__*"},
       sql: {dialect: postgres, protected: ["prod.*"], input_keys: [query]}}
"""


@pytest.mark.parametrize(
    ("stage", "tool", "tool_input", "expected"),
    [
        ("spawn", "Bash", {"command": ["make", "deploy"]}, ("deny", "no_make", "spawn-only")),
        ("tool_call", "Bash", {"command": "make deploy"}, ("allow", "no_rule_matched", None)),
        ("tool_call", "Write", {"file_path": "/etc/passwd"}, ("deny", "system_file", "write-etc")),
        ("tool_call", "write", {"file_path": "/etc/passwd"}, ("deny", "system_file", "write-etc")),
        ("tool_call", "Write", {"file_path": "/tmp/x"}, ("allow", "no_rule_matched", None)),
        (
            "tool_call",
            "mcp__db__query",
            {"query": "DROP TABLE prod.t"},
            ("deny", "sql_destructive_protected", "sql-tool"),
        ),
        (
            "tool_call",
            "mcp__db__query",
            {"query": "SELECT 1"},
            ("allow", "sql_allowed", "sql-tool"),
        ),
        (
            "tool_call",
            "mcp__db__query",
            {"text": "DROP TABLE prod.t"},
            ("deny", "unverifiable_sql", "sql-tool"),
        ),
        ("tool_call", "Bash", {}, ("deny", "unverifiable_command", None)),
        ("tool_call", "exec_command", {"cmd": "make x"}, ("allow", "no_rule_matched", None)),
    ],
)
def test_stages_tools_and_inputs(
    stage: str, tool: str, tool_input: dict[str, Any], expected: tuple[str, str, str | None]
) -> None:
    v = load_rules(STAGED).evaluate("r", stage, tool, tool_input)
    assert (v.verdict, v.reason, v.rule_id) == expected


def test_sql_tool_approval_binds_tool_and_input() -> None:
    v = DEFAULTS.evaluate(
        "lakehouse", "tool_call", "mcp__duckdb__query", {"query": "DELETE FROM prod.t WHERE id = 1"}
    )
    assert v.verdict == "require_approval"
    assert v.approval_subject == ('mcp__duckdb__query {"query": "DELETE FROM prod.t WHERE id = 1"}')


def test_check_sql_uses_the_roles_sql_rule() -> None:
    v = DEFAULTS.check_sql("lakehouse", "DELETE FROM prod.orders")
    assert (v.verdict, v.reason, v.rule_id) == (
        "deny",
        "sql_destructive_protected",
        "protect-prod-duckdb",
    )
    v = DEFAULTS.check_sql("lakehouse", "DELETE FROM prod.orders WHERE id = 1")
    assert v.approval_subject == "DELETE FROM prod.orders WHERE id = 1"
    # a role without an SQL rule: nothing is protected, the structure is still checked
    assert DEFAULTS.check_sql("notebook", "DROP TABLE prod.x").verdict == "allow"
    assert DEFAULTS.check_sql("notebook", "SELECT 1; SELECT 2").reason == (
        "sql_multiple_statements"
    )


def test_unknown_stage_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown guardrail stage"):
        DEFAULTS.evaluate("r", "later", "Bash", {"command": "ls"})


# --------------------------------------------------------------------------------------------
# Loading: clear errors that name the rule
# --------------------------------------------------------------------------------------------

BAD_FILES = [
    ("roles:\n  a: [1\n", "guardrails: malformed YAML at line"),
    ("- a list\n", "guardrails: top level: must be a mapping"),
    ("rolez: {}\n", "guardrails: top level: unknown key 'rolez'"),
    ("version: 2\n", "guardrails: version: unsupported version 2"),
    ("roles:\n  a: {}\n", "guardrails: roles.a: must be a list of rules"),
    (
        "roles:\n  a:\n    - {when: {command: 'x *'}, verdict: deny, reason: r}\n",
        r"guardrails: roles.a\[0\].id: every rule needs an id",
    ),
    (
        "roles:\n  a:\n    - {id: x, verdict: deny, reason: r}\n",
        r"guardrails: roles.a\[0\].when: missing",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, verdict: block, reason: r}\n",
        r"guardrails: roles.a\[0\].verdict: 'block' is not allow",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, reason: r}\n",
        r"guardrails: roles.a\[0\].verdict: missing",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, verdict: deny, reason: Bad Reason}\n",
        r"guardrails: roles.a\[0\].reason: needs a snake_case machine code",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, verdict: deny, reason: r, "
        "colour: 1}\n",
        r"guardrails: roles.a\[0\]: unknown key 'colour'",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {commands: 'x *'}, verdict: deny, reason: r}\n",
        r"guardrails: roles.a\[0\].when: unknown key 'commands'",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: '*'}, verdict: deny, reason: r}\n",
        r"guardrails: roles.a\[0\].when.command: scope pattern '\*' would allow every command",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'k* *'}, verdict: deny, reason: r}\n",
        r"guardrails: roles.a\[0\].when.command: .*must be literal",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'kubectl patch * --replicas*'}, verdict: deny,"
        " reason: r}\n",
        r"roles.a\[0\].when.command: .*put '--replicas\*' under `option`",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *', option: [context]}, verdict: deny,"
        " reason: r}\n",
        r"roles.a\[0\].when.option: 'context' is not an option name",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *', stage: later}, verdict: deny,"
        " reason: r}\n",
        r"roles.a\[0\].when.stage: 'later' is not spawn or tool_call",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {tool: Write, command: 'x *'}, verdict: deny,"
        " reason: r}\n",
        r"roles.a\[0\].when: command, option.* only apply to shell tools",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, sql: {dialect: klingon}}\n",
        r"roles.a\[0\].sql.dialect: unknown dialect 'klingon'",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, verdict: deny, sql: {}}\n",
        r"roles.a\[0\].verdict: an sql rule takes its verdict from the SQL checker",
    ),
    (
        "roles:\n  a:\n    - {id: x, when: {command: 'x *'}, verdict: deny, reason: r}\n"
        "    - {id: x, when: {command: 'y *'}, verdict: deny, reason: r}\n",
        r"roles.a\[1\]: duplicate rule id 'x'",
    ),
    ("programs:\n  psql: {flags: [-1]}\n", r"programs.psql.flags\[0\]: -1 is not a non-empty"),
    ("programs:\n  psql: {valued: [-c], verbose: true}\n", r"programs.psql: unknown key"),
]


@pytest.mark.parametrize(("text", "error"), BAD_FILES)
def test_bad_rule_files_name_the_place(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        load_rules(text)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"guardrails: cannot read .*nope\.yaml"):
        load_rules(tmp_path / "nope.yaml")
    with pytest.raises(ValueError, match=r"guardrails: cannot read .*nope\.yaml"):
        load_rules(str(tmp_path / "nope.yaml"))


def test_load_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(
        "roles:\n  r:\n    - {id: x, when: {command: 'ls *'}, verdict: deny, reason: no_ls}\n"
    )
    assert bash("r", "ls -la", rules=load_rules(path)) == ("deny", "no_ls", "x")
    assert bash("r", "ls -la", rules=load_rules(str(path))) == ("deny", "no_ls", "x")


def test_empty_file_has_no_rules() -> None:
    assert bash("r", "kubectl delete pod x", rules=load_rules("")) == (
        "allow",
        "no_rule_matched",
        None,
    )


def test_merge_puts_the_operators_rules_first_and_replaces_by_id() -> None:
    mine = load_rules("""
roles:
  notebook:
    - {id: my-allow, when: {command: "kubectl delete configmap *"}, verdict: allow,
       reason: cleanup}
    - {id: no-stop-ray-jobs, when: {command: "ray job stop *"}, verdict: require_approval,
       reason: ray_stop}
""")
    merged = DEFAULTS.merged(mine)
    assert bash("notebook", "kubectl delete configmap x", rules=merged) == (
        "allow",
        "cleanup",
        "my-allow",
    )
    assert bash("notebook", "ray job stop j1", rules=merged) == (
        "require_approval",
        "ray_stop",
        "no-stop-ray-jobs",
    )
    # the other defaults still apply
    assert bash("notebook", "kubectl delete pod x", rules=merged) == (
        "deny",
        "destructive_on_running_jobs",
        "no-delete-running-jobs",
    )
    assert [r.id for r in merged.roles["notebook"]].count("no-stop-ray-jobs") == 1


# --------------------------------------------------------------------------------------------
# Sensitive reads through an allowed verb; code installed on a cluster needs a human
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "verdict", "reason", "rule"),
    [
        ("kubectl get secret db-pass -o yaml", "deny", "sensitive_read", "no-secret-reads"),
        ("kubectl get secrets", "deny", "sensitive_read", "no-secret-reads"),
        (
            "kubectl get secret/db-pass -o jsonpath='{.data.password}'",
            "deny",
            "sensitive_read",
            "no-secret-reads",
        ),
        ("kubectl -n ml get Secrets -o json", "deny", "sensitive_read", "no-secret-reads"),
        ("kubectl get configmaps,secrets -A", "deny", "sensitive_read", "no-secret-reads"),
        ("kubectl get secrets.v1. db", "deny", "sensitive_read", "no-secret-reads"),
        ("kubectl view-secret db-pass", "deny", "sensitive_read", "no-secret-reads"),
        ("kubectl get --raw /api/v1/namespaces/ml/secrets", "deny", "sensitive_read", "no-raw-api"),
        (
            "kubectl get --raw=/api/v1/namespaces/ml/secrets/db",
            "deny",
            "sensitive_read",
            "no-raw-api",
        ),
        ("kubectl config view --raw", "deny", "sensitive_read", "no-raw-api"),
        (
            "kubectl get pods | grep x && kubectl get secret x",
            "deny",
            "sensitive_read",
            "no-secret-reads",
        ),
        # not secrets: still read-only verbs
        ("kubectl get pods -o yaml", "allow", "read_only", "kubectl-reads"),
        ("kubectl get pod secret-rotator-0", "allow", "read_only", "kubectl-reads"),
        ("kubectl describe secret db-pass", "allow", "read_only", "kubectl-reads"),  # no values
    ],
)
def test_sensitive_reads_are_denied_in_every_role(
    command: str, verdict: str, reason: str, rule: str
) -> None:
    for role in ("notebook", "cluster", "policy", "nobody"):
        assert bash(role, command) == (verdict, reason, rule), role


@pytest.mark.parametrize(
    "command",
    [
        'ray job submit --runtime-env-json \'{"pip": ["requests"]}\' -- python t.py',
        "ray job submit --runtime-env env.yaml -- python t.py",
        "ray job submit --working-dir s3://bucket/code.zip -- python t.py",
        'sh -c "ray job submit --runtime-env-json \'{\\"conda\\": \\"x\\"}\' -- python t.py"',
    ],
)
def test_installing_code_on_a_cluster_needs_a_human(command: str) -> None:
    v = DEFAULTS.evaluate("notebook", "tool_call", "Bash", {"command": command})
    assert (v.verdict, v.reason, v.rule_id) == ("require_approval", "installs_code", None)
    assert v.approval_subject == command.strip()


def test_a_deny_rule_outranks_a_hold() -> None:
    command = "ray job submit --address http://other:8265 --runtime-env e.yaml -- python t.py"
    assert bash("notebook", command) == ("deny", "tool_redirected", "redirect-ray")


def test_commands_are_read_under_the_shell_that_runs_them() -> None:
    command = "kubectl get pods &>/dev/null kubectl delete pod x"
    bash_reading = DEFAULTS.evaluate("notebook", "tool_call", "Bash", {"command": command})
    assert bash_reading.verdict == "allow"  # bash: `kubectl get pods kubectl delete pod x`
    sh_reading = DEFAULTS.evaluate("notebook", "tool_call", "Bash", {"command": command}, "sh")
    assert (sh_reading.verdict, sh_reading.reason) == ("deny", "unverifiable_command")
    zsh = DEFAULTS.evaluate("notebook", "tool_call", "Bash", {"command": "ls"}, "zsh")
    assert zsh.verdict == "deny" and "models bash and sh" in zsh.message


def test_sql_rules_take_a_search_path_and_read_only() -> None:
    rules = load_rules("""
roles:
  analyst:
    - id: ro-psql
      when: {tool: Bash, command: "psql *"}
      sql: {dialect: postgres, protected: ["prod.*"], options: [-c], search_path: [prod],
            read_only: true}
  etl:
    - id: etl-psql
      when: {tool: Bash, command: "psql *"}
      sql: {dialect: postgres, protected: ["prod.*"], options: [-c], search_path: [prod]}
""")
    assert bash("analyst", "psql -c 'SELECT * FROM users'", rules=rules)[0] == "allow"
    assert bash("etl", "psql -c 'DELETE FROM users'", rules=rules) == (
        "deny",
        "sql_destructive_protected",
        "etl-psql",
    )
    assert bash("etl", "psql -c 'DELETE FROM users WHERE id = 1'", rules=rules) == (
        "require_approval",
        "sql_delete_protected",
        "etl-psql",
    )
    assert bash("analyst", "psql -c 'DELETE FROM users WHERE id = 1'", rules=rules) == (
        "deny",
        "sql_read_only",
        "ro-psql",
    )
    assert bash("analyst", "psql -c 'INSERT INTO scratch.t VALUES (1)'", rules=rules) == (
        "deny",
        "sql_read_only",
        "ro-psql",
    )
    assert bash("analyst", "psql -c 'SET TRANSACTION READ WRITE'", rules=rules) == (
        "deny",
        "sql_session_state",
        "ro-psql",
    )
    with pytest.raises(ValueError, match="read_only: must be true or false"):
        load_rules("roles: {a: [{id: x, when: {command: 'psql *'}, sql: {read_only: 'yes'}}]}")
