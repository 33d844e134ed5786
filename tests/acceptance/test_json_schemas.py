"""Every `--json` output validates against its published JSON Schema (docs/reference/schemas/,
docs/reference/json-schema.md): the real `corral` commands, on a data directory with jobs that
ran through an engine, a dead-lettered one, one waiting for approval and governance records.

`COMMANDS_WITH_JSON` is checked against the commands of the `corral` app, so a new command with
`--json` fails here until it has a schema and a line below."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer

from corral.cli import app
from tests.acceptance.conftest import CONFIG, Corral
from tests.acceptance.test_knowledge_cli import seed
from tests.helpers import eventually

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "schemas"

GATED = CONFIG.replace(
    "environments:",
    """\
  gated:
    concurrency: 2
    requires_approval: true
environments:""",
)

# Every command that takes --json (groups spelled out), as `corral … --help` lists them
COMMANDS_WITH_JSON = {
    "submit",
    "jobs",
    "show",
    "trace",
    "cancel",
    "wait",
    "workspaces",
    "events",
    "events tail",
    "status",
    "version",
    "config check",
    "report",
    "incidents",
    "runs",
    "pause",
    "resume",
    "dlq list",
    "dlq show",
    "dlq requeue",
    "dlq purge",
    "audit verify",
    "kill-switch on",
    "kill-switch off",
    "kill-switch status",
    "approvals list",
    "approvals approve",
    "approvals deny",
    "budget set",
    "budget status",
    "dark-launch enable",
    "dark-launch disable",
    "dark-launch status",
    "policy check",
    "policy log",
    "policy stats",
    "config show",
    "breakers",
    "breakers reset",
    "escalations list",
    "escalations clear",
    "guard check",
    "token create",
    "token list",
    "token revoke",
    "gc",
    "world",
    "world baselines",
    "replay",
    "epic run",
    "epic status",
    "epic show",
    "epic cancel",
    "knowledge list",
    "knowledge search",
    "knowledge show",
    "knowledge promote",
    "knowledge retire",
    "knowledge stats",
}


def conforms(name: str, data: Any, *, many: bool = False) -> Any:
    """`data` (a list of them if `many`) validates against schemas/NAME.json."""
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=None)
    items = data if many else [data]
    if many:
        assert isinstance(data, list), data
    for item in items:
        errors = sorted(validator.iter_errors(item), key=str)
        assert not errors, f"{name}: {errors[0].message} at {list(errors[0].path)}\n{item}"
    return data


def js(c: Corral, *args: str) -> Any:
    """`corral ARGS --json`, the option before a `--` that ends them."""
    at = args.index("--") if "--" in args else len(args)
    return json.loads(c.ok(*args[:at], "--json", *args[at:]))


def _with_json(command: Any, path: str = "") -> set[str]:
    """The commands under `command` (itself included) that have a `--json` option."""
    found = {path} if any("--json" in p.opts for p in command.params) else set()
    if hasattr(command, "commands"):  # a group
        for name, sub in command.commands.items():
            found |= _with_json(sub, f"{path} {name}".strip())
    return found


def test_the_list_names_every_command_that_takes_json() -> None:
    assert _with_json(typer.main.get_command(app)) == COMMANDS_WITH_JSON


@pytest.mark.slow
def test_every_json_output_validates_against_its_schema(tmp_path: Path) -> None:
    c = Corral(tmp_path, GATED)
    try:
        _jobs_and_queue(c)
        _governance(c)
        _policy_and_config(c)
        _mechanism(c)
        _knowledge(c)
    finally:
        c.stop_all()


def _jobs_and_queue(c: Corral) -> None:
    conforms("Version", c.json("version"))
    c.serve()
    done = conforms("Submitted", js(c, "submit", "--", "true"))["id"]
    failed = [
        js(c, "submit", "--max-attempts", "1", "--", "sh", "-c", "exit 3")["id"] for _ in range(2)
    ]
    conforms("Job", json.loads(c.run("wait", done, "--json").stdout))
    for job in failed:
        c.wait(job)
    held = c.submit("sleep", "30", opts=("--workspace", str(c.work)))
    assert c.wait(held, until="running") == 0
    assert conforms("Workspace", c.json("workspaces"), many=True)
    conforms("Cancelled", c.json("cancel", held))
    assert len(conforms("Job", c.json("jobs"), many=True)) == 4
    shown = conforms("JobShow", c.json("show", done))
    assert shown["attempts"] and shown["timeline"]
    conforms("Trace", c.json("trace", done))
    assert conforms("Job", c.json("dlq", "list"), many=True)
    conforms("JobShow", c.json("dlq", "show", failed[0]))
    conforms("Requeued", c.json("dlq", "requeue", failed[0]))
    conforms("Purged", c.json("dlq", "purge", failed[1]))
    report = eventually(lambda: c.json("report", done).get("id"), what="the run report")
    assert report
    conforms("RunReport", c.json("report", done))
    eventually(lambda: c.json("report", failed[1]).get("id"), what="a failure's report")
    assert conforms("Incident", c.json("incidents"), many=True)
    assert conforms("UnifiedRun", c.json("runs"), many=True)
    conforms("AuditReport", c.json("audit", "verify"))
    assert conforms("Replay", c.json("replay", done))["steps"]


def _governance(c: Corral) -> None:
    switch = conforms(
        "KillSwitch",
        c.json("kill-switch", "on", "--scope", "role", "--target", "serial", "--reason", "test"),
    )
    assert conforms("KillSwitch", c.json("kill-switch", "status"), many=True)
    assert conforms("KillSwitch", c.json("kill-switch", "off", switch["id"]), many=True)
    conforms("Pause", c.json("pause", "--scope", "role", "--target", "serial", "--reason", "t"))
    assert conforms("Pause", c.json("resume", "--scope", "role", "--target", "serial"), many=True)
    gated = [c.submit("true", opts=("--role", "gated")) for _ in range(2)]
    pending = conforms("Approval", c.json("approvals", "list"), many=True)
    by_job = {a["job_id"]: a["id"] for a in pending}
    conforms("Approval", c.json("approvals", "approve", by_job[gated[0]]))
    conforms("Approval", c.json("approvals", "deny", by_job[gated[1]]))


def _policy_and_config(c: Corral) -> None:
    conforms(
        "BudgetSet",
        c.json(
            "budget",
            "set",
            "--scope",
            "tenant",
            "--target",
            "default",
            "--period",
            "daily",
            "--ceiling-usd",
            "10",
        ),
    )
    assert conforms("Budget", c.json("budget", "status"), many=True)
    conforms("DarkLaunch", c.json("dark-launch", "enable", "nightly", "--percentage", "50"))
    conforms("DarkLaunch", c.json("dark-launch", "status", "nightly"))
    assert conforms("DarkLaunch", c.json("dark-launch", "status"), many=True)
    conforms("DarkLaunch", c.json("dark-launch", "disable", "nightly"))
    conforms("PolicyCheck", c.json("policy", "check", "--role", "default"))
    paused = c.run("policy", "check", "--role", "gated", "--json")  # exit 8: approval
    conforms("PolicyCheck", json.loads(paused.stdout))
    assert conforms("PolicyEvaluation", c.json("policy", "log"), many=True)
    conforms("PolicyStats", c.json("policy", "stats"))
    conforms("ConfigShown", c.json("config", "show"))
    conforms("ConfigChecked", c.json("config", "check"))
    for how in (("--", "ls"), ("--stage", "spawn", "--", "ls"), ("--sql", "SELECT 1")):
        out = c.run("guard", "check", "--role", "default", "--json", *how)  # exit 1: deny
        conforms("GuardCheck", json.loads(out.stdout))


def _mechanism(c: Corral) -> None:
    conforms("EngineStatus", c.json("status"))
    breakers = conforms("Breaker", c.json("breakers"), many=True)
    assert breakers
    conforms("BreakerReset", c.json("breakers", "reset", breakers[0]["name"]))
    conforms("Escalation", c.json("escalations", "list"), many=True)
    conforms("CoreEvent", c.json("events"), many=True)
    # `escalations clear` needs an escalation (a core crash loop): tests/acceptance/
    # test_mechanism.py makes one and asserts its output, which EscalationCleared describes
    conforms("EscalationCleared", {"escalation": "e1", "cleared": True})
    made = conforms(
        "TokenCreated",
        c.json("token", "create", "--tenant", "acme", "--scopes", "jobs:read", "--name", "ci"),
    )
    assert made["token"].startswith("crl_")
    listed = conforms("Token", c.json("token", "list"), many=True)
    assert [t["id"] for t in listed] == [made["id"]] and "token" not in listed[0]
    assert conforms("Token", c.json("token", "revoke", made["id"]))["revoked_at"]
    shown = conforms("WorldModel", c.json("world"))
    assert shown["user_plane"] and shown["causal_graph"]
    # empty here (no agent attempt ran): tests/unit/test_anomaly.py checks a filled one
    conforms("Baseline", c.json("world", "baselines"), many=True)


def _knowledge(c: Corral) -> None:
    seed(c)  # two learnings, as the engine's flywheel writes them from agent runs
    listed = conforms("Learning", c.json("knowledge", "list"), many=True)
    pending = next(x for x in listed if x["status"] == "pending")
    active = next(x for x in listed if x["status"] == "active")
    assert conforms("Learning", c.json("knowledge", "search", "flaky seed"), many=True)
    shown = conforms("LearningShow", c.json("knowledge", "show", active["id"]))
    assert shown["history"] and shown["provenance"]["job_id"]
    conforms("Learning", c.json("knowledge", "promote", pending["id"], "--note", "ok"))
    conforms("LearningShow", c.json("knowledge", "show", pending["id"]))
    conforms("Learning", c.json("knowledge", "retire", active["id"], "--reason", "obsolete"))
    stats = conforms("KnowledgeStats", c.json("knowledge", "stats"))
    assert stats["learnings"] == {"active": 1, "pending": 0, "retired": 1}
