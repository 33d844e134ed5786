"""`corral guard check`: operators try a command or SQL against the guardrails and see the verdict,
the reason and the rule that decided; the exit status is the verdict (0 allow, 1 deny,
2 require_approval); bad input is one clear line on stderr."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.conftest import Corral


def check(corral: Corral, *args: str) -> subprocess.CompletedProcess[str]:
    return corral.run("guard", "check", *args)


@pytest.mark.parametrize(("args", "code", "verdict", "reason", "rule"), [
    (("--role", "notebook", "--", "kubectl delete pod trainer-0"), 1, "deny",
     "destructive_on_running_jobs", "no-delete-running-jobs"),
    (("--role", "notebook", "--", "kubectl", "-n", "ml", "delete", "job", "train"), 1, "deny",
     "destructive_on_running_jobs", "no-delete-running-jobs"),
    (("--role", "notebook", "--", "kubectl scale deploy web --replicas=4"), 8,
     "require_approval", "cluster_scaling", "scaling-needs-approval"),
    (("--role", "cluster", "--", "helm uninstall web --force"), 8, "require_approval",
     "helm_uninstall", "helm-uninstall-needs-approval"),
    (("--role", "wandb", "--", "wandb artifact rm team/proj/model:v3"), 1, "deny",
     "run_deletion", "no-run-deletion"),
    (("--role", "lakehouse", "--", "duckdb lake.duckdb -c 'DROP TABLE prod.sales'"), 1, "deny",
     "sql_destructive_protected", "protect-prod-duckdb"),
    (("--role", "lakehouse", "--sql", "DELETE FROM prod.sales"), 1, "deny",
     "sql_destructive_protected", "protect-prod-duckdb"),
    (("--role", "lakehouse", "--sql", "DELETE FROM prod.sales WHERE id = 7"), 8,
     "require_approval", "sql_delete_protected", "protect-prod-duckdb"),
    (("--role", "lakehouse", "--sql", "SELECT * FROM prod.sales"), 0, "allow", "sql_allowed",
     "protect-prod-duckdb"),
    (("--role", "lakehouse", "--sql", "WITH d AS (DELETE FROM prod.s RETURNING *) SELECT 1",
      "--dialect", "postgres"), 1, "deny", "sql_destructive_protected", "protect-prod-duckdb"),
    (("--role", "nobody", "--", "kubectl get pods --context=prod-admin"), 1, "deny",
     "tool_redirected", "redirect-kubectl"),
    (("--role", "nobody", "--", "git status && ls"), 0, "allow", "no_rule_matched", None),
    (("--role", "nobody", "--", "echo $(kubectl delete pod x)"), 1, "deny",
     "unverifiable_command", None),
])
def test_verdict_reason_rule_and_exit_status(corral: Corral, args: tuple[str, ...], code: int,
                                             verdict: str, reason: str,
                                             rule: str | None) -> None:
    r = check(corral, "--json", *args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert (out["verdict"], out["reason"], out["rule_id"]) == (verdict, reason, rule)
    if verdict == "require_approval":
        subject = out["approval_subject"]
        assert out["approval_digest"] == hashlib.sha256(subject.encode()).hexdigest()
    else:
        assert out["approval_subject"] is None


def test_human_output_names_rule_command_and_approval(corral: Corral) -> None:
    r = check(corral, "--role", "cluster", "--", "helm uninstall web -n ml --force")
    assert r.returncode == 8, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("require_approval  reason=helm_uninstall  "
                        "rule=helm-uninstall-needs-approval")
    assert "  about:   helm uninstall web -n ml --force" in lines
    assert "  approve: helm uninstall web -n ml --force" in lines
    assert any("`--force` is not consent" in line for line in lines)
    digest = hashlib.sha256(b"helm uninstall web -n ml --force").hexdigest()
    assert f"  digest:  sha256:{digest}" in lines

    r = check(corral, "--role", "notebook", "--", "kubectl get pods && kubectl delete pod x")
    assert r.returncode == 1
    assert r.stdout.splitlines()[:2] == [
        "deny  reason=destructive_on_running_jobs  rule=no-delete-running-jobs",
        "  about:   kubectl delete pod x",
    ]


def test_rules_file_is_merged_in_front_of_the_defaults(corral: Corral, tmp_path: Path) -> None:
    rules = tmp_path / "guardrails.yaml"
    rules.write_text("""
roles:
  notebook:
    - id: cleanup-configmaps
      when: {tool: Bash, command: "kubectl delete configmap *"}
      verdict: allow
      reason: cleanup
    - id: no-git-push
      when: {tool: Bash, command: "git push *"}
      verdict: deny
      reason: no_push
""")
    r = check(corral, "--json", "--role", "notebook", "--rules", str(rules), "--",
              "kubectl delete configmap old")
    assert (r.returncode, json.loads(r.stdout)["rule_id"]) == (0, "cleanup-configmaps")
    r = check(corral, "--json", "--role", "notebook", "--rules", str(rules), "--",
              "git push origin main")
    assert (r.returncode, json.loads(r.stdout)["reason"]) == (1, "no_push")
    r = check(corral, "--json", "--role", "notebook", "--rules", str(rules), "--",
              "kubectl delete pod x")  # the defaults still apply
    assert (r.returncode, json.loads(r.stdout)["rule_id"]) == (1, "no-delete-running-jobs")
    r = check(corral, "--json", "--role", "notebook", "--rules", str(rules), "--no-defaults",
              "--", "kubectl delete pod x")
    assert (r.returncode, json.loads(r.stdout)["reason"]) == (0, "no_rule_matched")


def _one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(("text", "needles"), [
    ("roles:\n  notebook: [1\n", ("guardrails: malformed YAML at line",)),
    ("roles:\n  notebook:\n    - {id: x, when: {command: 'kubectl *'}, verdict: block, "
     "reason: r}\n", ("guardrails: roles.notebook[0].verdict: 'block' is not allow",)),
    ("roles:\n  notebook:\n    - {id: x, when: {command: 'helm uninstall *', option: [--force]},"
     " verdict: allow, reason: forced}\n", ("roles.notebook[0]: an allow rule cannot depend on "
                                            "'--force'",)),
])
def test_invalid_rules_file_is_one_line(corral: Corral, tmp_path: Path, text: str,
                                        needles: tuple[str, ...]) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text(text)
    _one_line_error(check(corral, "--role", "notebook", "--rules", str(rules), "--", "ls"), 2,
                    *needles)


def test_bad_input_is_one_line(corral: Corral, tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    _one_line_error(check(corral, "--role", "x", "--rules", str(missing), "--", "ls"), 2,
                    "guardrails: cannot read", "missing.yaml")
    _one_line_error(check(corral, "--role", "x"), 2, "nothing to check")
    _one_line_error(check(corral, "--role", "x", "--sql", "SELECT 1", "--", "ls"), 2,
                    "either a command")
    _one_line_error(check(corral, "--role", "x", "--sql", "SELECT 1", "--dialect", "klingon"),
                    2, "unknown SQL dialect 'klingon'")
    _one_line_error(check(corral, "--role", "x", "--stage", "later", "--", "ls"), 2,
                    "--stage must be spawn or tool_call")
