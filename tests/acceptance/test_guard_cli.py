"""`corral guard check`: operators try a tool call, a command or SQL and see exactly what the
engine would decide for an agent of the role — its tool scope, then its guardrails — the
reason, the rule and which part decided; the exit status is the verdict (0 allow, 1 deny,
8 require_approval); bad input is one clear line on stderr."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Corral

ROOT = Path(__file__).resolve().parents[2]
# The shipped roles, and a reader like the one the guardrail classes were found with
CONFIG = (
    (ROOT / "examples" / "corral.yaml").read_text()
    + """
  reader:
    worker: claude-code
    tools: ["Bash(kubectl get *)", "Bash(kubectl describe *)", "Bash(ray job submit *)",
            "Bash(ray job status *)", "Bash(helm status *)", "Read", "Write(out/**)"]
  etl:
    worker: codex
    tools: ["Bash(psql *)", "Bash(kubectl get * &)", "Bash(ray job submit *)",
            "Bash(python *)"]
guardrails: etl-guardrails.yaml
"""
)
ETL_RULES = """
roles:
  etl:
    - id: ro-psql
      when: {tool: Bash, command: "psql *"}
      sql: {dialect: postgres, protected: ["prod.*"], options: [-c], search_path: [prod],
            read_only: true}
"""


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    c = Corral(tmp_path, CONFIG)
    (tmp_path / "etl-guardrails.yaml").write_text(ETL_RULES)
    (c.work / "out").mkdir()
    (c.work / "etc").symlink_to("/etc")
    try:
        yield c
    finally:
        c.stop_all()


def check(corral: Corral, *args: str) -> subprocess.CompletedProcess[str]:
    return corral.run("guard", "check", *args)


def verdict_of(corral: Corral, *args: str) -> tuple[int, dict[str, Any]]:
    r = check(corral, "--json", *args)
    assert r.stderr == "", r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize(
    ("args", "code", "verdict", "reason", "rule"),
    [
        (
            ("--role", "notebook", "--", "kubectl delete pod trainer-0"),
            1,
            "deny",
            "destructive_on_running_jobs",
            "no-delete-running-jobs",
        ),
        (
            ("--role", "notebook", "--", "kubectl scale deploy web --replicas=4"),
            8,
            "require_approval",
            "cluster_scaling",
            "scaling-needs-approval",
        ),
        (
            ("--role", "cluster", "--", "helm uninstall web --force"),
            8,
            "require_approval",
            "helm_uninstall",
            "helm-uninstall-needs-approval",
        ),
        (
            ("--role", "lakehouse", "--", "duckdb lake.duckdb -c 'DROP TABLE prod.sales'"),
            1,
            "deny",
            "sql_destructive_protected",
            "protect-prod-duckdb",
        ),
        (
            ("--role", "lakehouse", "--sql", "DELETE FROM prod.sales WHERE id = 7"),
            8,
            "require_approval",
            "sql_delete_protected",
            "protect-prod-duckdb",
        ),
        (
            (
                "--role",
                "lakehouse",
                "--sql",
                "WITH d AS (DELETE FROM prod.s RETURNING *) SELECT 1",
                "--dialect",
                "postgres",
            ),
            1,
            "deny",
            "sql_destructive_protected",
            "protect-prod-duckdb",
        ),
        (
            ("--role", "notebook", "--", "kubectl get pods && ray job status x"),
            0,
            "allow",
            "allowed",
            "kubectl-reads",
        ),
        (
            ("--role", "notebook", "--", "echo $(kubectl delete pod x)"),
            1,
            "deny",
            "out_of_scope",
            None,
        ),
    ],
)
def test_verdict_reason_rule_and_exit_status(
    corral: Corral, args: tuple[str, ...], code: int, verdict: str, reason: str, rule: str | None
) -> None:
    r = check(corral, "--json", *args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert (out["verdict"], out["reason"], out["rule_id"]) == (verdict, reason, rule)
    if verdict == "require_approval":
        subject = out["approval_subject"]
        assert out["approval_digest"] == hashlib.sha256(subject.encode()).hexdigest()
    else:
        assert out["approval_subject"] is None


# One decision path: the role's scope, then its guardrails, exactly as the engine decides.
# Each class of command that a word-wise scope let through, as a subprocess: (role, args,
# exit status, the part that decided, a fragment of the message)
CLASSES = [
    # the scope first: `rm` is no kubectl command, however harmless the guardrails think it
    ("notebook", ("--", "rm -rf /"), 1, "scope", "`rm -rf /` is outside this role's scope"),
    # redirections are file writes and reads
    ("reader", ("--", "kubectl get pods > ~/.bashrc"), 1, "scope", "outside this role's write"),
    # privilege changes, detaching, shell wrappers
    ("reader", ("--", "sudo kubectl get pods"), 1, "scope", "changes privileges"),
    ("reader", ("--", "nohup kubectl get pods &"), 1, "scope", "detached from the attempt"),
    ("etl", ("--", "kubectl get pods &"), 0, "scope", "is in scope"),  # `kubectl get * &`
    ("reader", ("--", "bash -c 'kubectl get pods'"), 1, "scope", "`bash -c 'kubectl get pods'`"),
    # path-qualified programs, unquoted globs, look-alike characters
    ("reader", ("--", "./kubectl get pods"), 1, "scope", "`./kubectl get pods` is outside"),
    ("reader", ("--", "kubectl get po*"), 1, "scope", "into file names"),
    ("reader", ("--", "kubectl get pods\uff1b rm -rf /"), 1, "scope", "FULLWIDTH SEMICOLON"),
    # commands that run commands, and code installed on a cluster
    (
        "reader",
        ("--", "ray job submit -- 'ray job status x; rm -rf /'"),
        1,
        "scope",
        "`rm -rf /` is outside",
    ),
    (
        "etl",
        ("--", 'ray job submit --runtime-env-json \'{"pip": ["x"]}\' -- python t.py'),
        8,
        "guardrail",
        "installs or fetches code",
    ),
    (
        "notebook",
        ("--", "kubectl exec web-0 -- cat /etc/shadow"),
        1,
        "scope",
        "`cat /etc/shadow` is outside",
    ),
    # sensitive reads through an allowed verb
    ("reader", ("--", "kubectl get secret db -o yaml"), 1, "guardrail", "secrets"),
    # the shell that runs it: under dash `&>` is `&` then `>`
    (
        "reader",
        ("--shell", "sh", "--", "kubectl get pods &>/dev/null touch M"),
        1,
        "scope",
        "runs under sh",
    ),
    # file tools: paths resolved in the workspace
    (
        "reader",
        ("--tool", "Read", "--input", '{"file_path": "etc/passwd"}'),
        1,
        "scope",
        "/etc/passwd",
    ),
    (
        "reader",
        (
            "--tool",
            "apply_patch",
            "--input",
            '{"command": "*** Begin Patch\\n*** Add File: ../x\\n+x\\n*** End Patch"}',
        ),
        1,
        "scope",
        "write scope",
    ),
    # SQL: read-only role, search path
    (
        "etl",
        ("--shell", "sh", "--", "psql -c 'DELETE FROM users WHERE id = 1'"),
        1,
        "guardrail",
        "read-only",
    ),
    ("etl", ("--", "psql -c 'SELECT pg_terminate_backend(7)'"), 1, "guardrail", "administrative"),
]


@pytest.mark.parametrize(("role", "args", "code", "by", "fragment"), CLASSES)
def test_each_class_is_decided_like_the_engine(
    corral: Corral, role: str, args: tuple[str, ...], code: int, by: str, fragment: str
) -> None:
    args = tuple(a.encode().decode("unicode_escape") if "\\u" in a else a for a in args)
    got, out = verdict_of(corral, "--role", role, "--cwd", str(corral.work), *args)
    assert (got, out["decided_by"]) == (code, by), out
    assert fragment in out["message"], out["message"]


def test_human_output_names_rule_command_and_approval(corral: Corral) -> None:
    r = check(corral, "--role", "cluster", "--", "helm uninstall web -n ml --force")
    assert r.returncode == 8, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "require_approval  reason=helm_uninstall  rule=helm-uninstall-needs-approval  by=guardrail"
    )
    assert "  about:   helm uninstall web -n ml --force" in lines
    assert "  approve: helm uninstall web -n ml --force" in lines
    assert any("`--force` is not consent" in line for line in lines)
    digest = hashlib.sha256(b"helm uninstall web -n ml --force").hexdigest()
    assert f"  digest:  sha256:{digest}" in lines

    r = check(corral, "--role", "notebook", "--", "kubectl get pods && kubectl delete pod x")
    assert r.returncode == 1
    assert r.stdout.splitlines()[:2] == [
        "deny  reason=destructive_on_running_jobs  rule=no-delete-running-jobs  by=guardrail",
        "  about:   kubectl delete pod x",
    ]
    r = check(corral, "--role", "cluster", "--", "rm -rf /")
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == "deny  reason=out_of_scope  rule=(none)  by=scope"


def test_help_states_the_exit_statuses_it_returns(corral: Corral) -> None:
    r = check(corral, "--help")
    assert r.returncode == 0
    assert "0 allow, 1 deny, 8 require_approval" in " ".join(r.stdout.split())


def test_rules_file_is_merged_in_front_of_the_defaults(corral: Corral, tmp_path: Path) -> None:
    rules = tmp_path / "guardrails.yaml"
    rules.write_text("""
roles:
  notebook:
    - id: cleanup-configmaps
      when: {tool: Bash, command: "kubectl delete configmap *"}
      verdict: allow
      reason: cleanup
    - id: no-kubectl-cp
      when: {tool: Bash, command: "kubectl cp *"}
      verdict: deny
      reason: no_copy
""")
    r = check(
        corral,
        "--json",
        "--role",
        "notebook",
        "--rules",
        str(rules),
        "--",
        "kubectl delete configmap old",
    )
    assert (r.returncode, json.loads(r.stdout)["rule_id"]) == (0, "cleanup-configmaps")
    r = check(
        corral,
        "--json",
        "--role",
        "notebook",
        "--rules",
        str(rules),
        "--",
        "kubectl cp web-0:/data ./data",
    )
    assert (r.returncode, json.loads(r.stdout)["reason"]) == (1, "no_copy")
    r = check(
        corral, "--json", "--role", "notebook", "--rules", str(rules), "--", "kubectl delete pod x"
    )  # the defaults still apply
    assert (r.returncode, json.loads(r.stdout)["rule_id"]) == (1, "no-delete-running-jobs")
    r = check(
        corral,
        "--json",
        "--role",
        "notebook",
        "--rules",
        str(rules),
        "--no-defaults",
        "--",
        "kubectl delete pod x",
    )
    assert (r.returncode, json.loads(r.stdout)["rule_id"]) == (0, None)


def _one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("roles:\n  notebook: [1\n", ("guardrails: malformed YAML at line",)),
        (
            "roles:\n  notebook:\n    - {id: x, when: {command: 'kubectl *'}, verdict: block, "
            "reason: r}\n",
            ("guardrails: roles.notebook[0].verdict: 'block' is not allow",),
        ),
        (
            "roles:\n  notebook:\n    - {id: x, when: {command: 'helm uninstall *', "
            "option: [--force]},"
            " verdict: allow, reason: forced}\n",
            ("roles.notebook[0]: an allow rule cannot depend on '--force'",),
        ),
    ],
)
def test_invalid_rules_file_is_one_line(
    corral: Corral, tmp_path: Path, text: str, needles: tuple[str, ...]
) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text(text)
    _one_line_error(
        check(corral, "--role", "notebook", "--rules", str(rules), "--", "ls"), 2, *needles
    )


def test_bad_input_is_one_line(corral: Corral, tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    _one_line_error(
        check(corral, "--role", "x", "--rules", str(missing), "--", "ls"),
        2,
        "guardrails: cannot read",
        "missing.yaml",
    )
    _one_line_error(check(corral, "--role", "nobody", "--", "ls"), 2, "unknown role 'nobody'")
    _one_line_error(check(corral, "--role", "reader"), 2, "nothing to check")
    _one_line_error(check(corral, "--role", "reader", "--tool", "Read"), 2, "needs --input")
    _one_line_error(
        check(corral, "--role", "reader", "--tool", "Read", "--input", "[1]"),
        2,
        "must be a JSON object",
    )
    _one_line_error(
        check(corral, "--role", "reader", "--shell", "zsh", "--", "ls"),
        2,
        "--shell must be bash or sh",
    )
    _one_line_error(
        check(corral, "--role", "x", "--sql", "SELECT 1", "--", "ls"), 2, "either a call"
    )
    _one_line_error(
        check(corral, "--role", "x", "--sql", "SELECT 1", "--dialect", "klingon"),
        2,
        "unknown SQL dialect 'klingon'",
    )
    _one_line_error(
        check(corral, "--role", "x", "--stage", "later", "--", "ls"),
        2,
        "--stage must be spawn or tool_call",
    )
