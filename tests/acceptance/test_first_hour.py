"""What a new operator meets in the first hour, through the real `corral` command: the README's
Quickstart run in order, its failing examples included, and what `corral` says on the way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents import API_KEY, CLAUDE
from tests.agentmock import AnthropicMock
from tests.helpers import eventually


def _breakers(c: Corral) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(c.ok("breakers", "--json"))
    return found


def test_the_quickstarts_failing_jobs_leave_the_command_breaker_closed(corral: Corral) -> None:
    c = corral
    c.serve()
    assert c.run("submit", "--wait", "--timeout", "1", "--", "sleep", "60").returncode == 124
    failing = (
        ["sh", "-c", "exit 3"],
        ["make", "report"],
        ["sh", "-c", "kill -9 $$"],
        ["no-such-program-4f1c"],
    )
    for argv in failing:  # each retried once (but the program that does not exist)
        assert c.run("submit", "--wait", "--max-attempts", "2", "--", *argv).returncode != 0
    hello = c.ok("submit", "--wait", "--json", "--", "echo", "hi")
    job = json.loads(hello)["id"]
    assert c.job(job)["state"] == "SUCCEEDED"
    assert all(b["state"] == "CLOSED" for b in _breakers(c)), _breakers(c)
    assert json.loads(c.ok("events", "--kind", "breaker", "--json")) == []
    assert json.loads(c.ok("escalations", "list", "--json")) == [], "no crash loop either"
    faults = [
        e["data"].get("fault")
        for j in json.loads(c.ok("jobs", "--json"))
        for e in c.job(j["id"])["timeline"]
        if e["kind"] == "attempt_ended"
    ]
    assert sorted(faults, key=str) == [None] + ["job"] * 8, faults  # all the jobs' own
    verdicts = json.loads(c.ok("policy", "log", "--job", job, "--json"))
    # at submission, then once at dispatch: not once per dispatch round
    assert [(v["verdict"], v["reason"]) for v in verdicts] == [("allow", "allowed")] * 2


def claude_config(mock_url: str, *, max_attempts: int, extra: str = "") -> str:
    """A `claude-code` role against the loopback mock; the CLI retries no failed API call."""
    return f"""
scheduler: {{poll_interval_s: 0.2}}
roles:
  agent:
    worker: claude-code
    tools: ["Bash(ls *)"]
    retry: {{base_s: 0.05, cap_s: 0.2}}
    limits: {{max_attempts: {max_attempts}, timeout_s: 60, grace_s: 2}}
workers:
  claude-code:
    binary: {CLAUDE}
    version: 2.1.330
    summary_grace_s: 1
    env: {{ANTHROPIC_BASE_URL: "{mock_url}", ANTHROPIC_API_KEY: "{API_KEY}",
          CLAUDE_CODE_MAX_RETRIES: "0"}}
{extra}"""


@pytest.fixture
def claude_mock(clis: None) -> Iterator[AnthropicMock]:
    mock = AnthropicMock([]).start()
    try:
        yield mock
    finally:
        mock.close()


def test_an_agent_that_cannot_authenticate_fails_at_once_with_the_clis_words(
    tmp_path: Path, claude_mock: AnthropicMock
) -> None:
    claude_mock.script[:] = [{"status": 401, "message": "invalid x-api-key", "loop": True}]
    c = Corral(tmp_path, claude_config(claude_mock.url, max_attempts=3))
    try:
        c.serve()
        job = c.ok("submit", "--role", "agent", "--prompt", "list the files").strip()
        assert c.wait(job, timeout=90) == 1
        info = c.job(job)
        assert info["state"] == "FAILED" and len(info["attempts"]) == 1, "not retried"
        error = info["last_error"]
        # Claude Code's own words for a refused key, not "exited with code 1"
        assert error.startswith("agent failed (api_error, HTTP 401): Invalid API key"), error
        assert info["attempts"][0]["error"] == error
        assert [e["data"]["fault"] for e in info["timeline"] if e["kind"] == "attempt_ended"] == [
            "config"
        ]
        assert "agent failed (api_error, HTTP 401)" in c.ok("show", job)
        report = eventually(lambda: c.json("report", job).get("summary"), what="the run report")
        assert "Invalid API key" in report
    finally:
        c.stop_all()


def test_a_failing_model_api_opens_the_agent_kinds_breaker(
    tmp_path: Path, claude_mock: AnthropicMock
) -> None:
    claude_mock.script[:] = [{"status": 529, "message": "overloaded", "loop": True}]
    c = Corral(
        tmp_path,
        claude_config(
            claude_mock.url,
            max_attempts=1,
            extra="breakers: {min_calls: 2, consecutive_failures: 2, open_s: 300}\n",
        ),
    )
    try:
        c.serve()
        for _ in range(2):
            job = c.ok("submit", "--role", "agent", "--prompt", "list the files").strip()
            assert c.wait(job, timeout=90) == 1
            assert "HTTP 529" in c.job(job)["last_error"]
        breakers = eventually(
            lambda: [b for b in _breakers(c) if b["state"] == "OPEN"], what="the breaker to open"
        )
        assert [b["name"] for b in breakers] == ["worker:claude-code"]
        waiting = c.ok("submit", "--role", "agent", "--prompt", "list the files").strip()
        rejected = eventually(
            lambda: [e for e in c.job(waiting)["timeline"] if e["kind"] == "permit_rejected"],
            what="a refusal",
        )
        assert rejected[0]["data"]["reason"] == "CIRCUIT_OPEN"
        assert c.job(waiting)["state"] == "QUEUED"
    finally:
        c.stop_all()


def test_ids_are_short_whole_and_accepted_by_prefix_or_suffix(corral: Corral) -> None:
    c = corral  # no engine: the store alone answers these
    jobs = [c.submit("sh", "-c", f"echo {'x' * 60} {n}") for n in range(3)]
    table = c.ok("jobs")  # not a terminal: rich lays it out for 80 columns
    assert max(len(line) for line in table.splitlines()) <= 80
    shown = [line.split()[0] for line in table.splitlines()[2:] if line[:1].isalnum()]
    assert len(shown) == 3 and all(6 <= len(s) < 26 for s in shown), table
    for form, job in zip(shown, reversed(jobs), strict=True):  # newest first
        assert job.endswith(form)
        assert c.json("show", form)["id"] == job  # what the table printed names the job
        assert c.json("show", job[:12])["id"] == job  # a prefix too
    common = jobs[0][:4]  # made within a second: they share their first characters
    r = c.run("show", common)
    assert r.returncode == 2 and "ambiguous: it names" in r.stderr and jobs[0] in r.stderr
    assert c.run("show", "zzzzzzzz").returncode == 4


def test_kill_switch_off_takes_a_short_id_and_says_which_switches_exist(corral: Corral) -> None:
    c = corral
    assert c.ok("kill-switch", "off").strip() == "no active kill switch: nothing to lift"
    switch = c.json(
        "kill-switch", "on", "--scope", "tenant", "--target", "acme", "--reason", "leak"
    )
    r = c.run("kill-switch", "off")  # the global scope has none: not "lifted 0"
    assert r.returncode == 2, r.stderr
    assert f"active: {switch['id']} (tenant acme)" in r.stderr and "\n" not in r.stderr.strip()
    lifted = c.json("kill-switch", "off", switch["id"][-7:])
    assert [s["id"] for s in lifted] == [switch["id"]]
    assert c.json("kill-switch", "status") == []
    r = c.run("kill-switch", "off", switch["id"][:10])
    assert r.returncode == 4 and "no active kill switch" in r.stderr


def test_without_an_engine_submit_says_so_and_wait_fails_fast(corral: Corral) -> None:
    c = corral
    r = c.run("submit", "--", "echo", "hi")
    assert r.returncode == 0 and "no engine is serving" in r.stderr, r.stderr
    queued = r.stdout.strip()
    assert json.loads(c.ok("submit", "--json", "--", "echo", "hi"))["engine_serving"] is False
    assert c.run("submit", "-q", "--", "echo", "hi").stderr == ""
    r = c.run("submit", "--wait", "--", "echo", "hi")
    assert (
        r.returncode == 7 and "no engine is serving" in r.stderr and "--no-engine-ok" in r.stderr
    ), r.stderr
    r = c.run("wait", queued)
    assert r.returncode == 7 and r.stderr.count("\n") == 1
    r = c.run("wait", queued, "--no-engine-ok", "--timeout", "3")  # waits, and says why
    assert r.returncode == 124, r.stderr
    assert f"corral: {queued[-6:]} is QUEUED: no engine is serving {c.data}" in r.stderr


def test_wait_says_why_a_job_waits_and_follow_streams_its_output(corral: Corral) -> None:
    c = corral
    c.serve()
    r = c.run(
        "submit",
        "--follow",
        "--max-attempts",
        "1",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    )
    assert (r.returncode, r.stdout.splitlines()[1:], r.stderr) == (3, ["out"], "err\n")
    c.ok("pause", "--reason", "maintenance")
    job = c.submit("echo", "paused")
    r = c.run("wait", job, "--timeout", "3")
    assert r.returncode == 124
    assert f"{job[-6:]} is QUEUED: paused (global: maintenance)" in r.stderr, r.stderr
    quiet = c.run("wait", job, "--timeout", "2", "-q")
    assert (quiet.returncode, quiet.stderr) == (124, f"corral: {job} is still QUEUED after 2.0s\n")
    c.ok("resume")
    done = c.run("wait", job, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["state"] == "SUCCEEDED"
    assert done.stderr == ""
    sleeper = c.submit("sleep", "60", opts=("--role", "serial"))
    assert c.wait(sleeper, until="running") == 0
    behind = c.submit("true", opts=("--role", "serial"))
    r = c.run("wait", behind, "--timeout", "3")
    assert r.returncode == 124
    assert "is QUEUED: role serial is at its concurrency cap" in r.stderr, r.stderr
    c.ok("cancel", sleeper)
    assert c.wait(behind) == 0


SECRET = "sk-ant-api03-corral-config-secret-0123456789"


def test_one_configuration_wherever_the_command_runs(corral: Corral) -> None:
    c = corral
    engine_config = f"""scheduler: {{poll_interval_s: 0.2}}
roles:
  default: {{}}
  notebook: {{concurrency: 2}}
workers:
  claude-code:
    env: {{ANTHROPIC_API_KEY: "{SECRET}"}}
"""
    c.config.write_text(engine_config)
    c.serve()
    c.config.write_text("roles: {default: {}}\n")  # this shell's file: no notebook role
    r = c.run("submit", "--wait", "--role", "notebook", "--", "echo", "hi")
    assert r.returncode == 0, r.stderr  # checked against the roles the engine runs
    assert (
        "is not the configuration the engine runs" in r.stderr
        and "`corral config show` prints it" in r.stderr
    ), r.stderr
    shown = c.json("config", "show")
    assert shown["active"] and shown["source"] == str(c.config) and not shown["local"]["same"]
    assert "notebook:" in shown["text"] and SECRET not in shown["text"]
    assert "ANTHROPIC_API_KEY: '[REDACTED]'" in shown["text"]
    text = c.ok("config", "show")
    assert text.startswith("# the configuration engine ") and "differs from the local" in text
    assert SECRET.encode() not in (c.data / "corral.db").read_bytes()
    c.config.write_text(engine_config)  # the same file again: nothing to say
    r = c.run("submit", "--role", "notebook", "--", "echo", "hi")
    assert r.returncode == 0 and "note" not in r.stderr, r.stderr
    assert c.json("config", "show")["local"]["same"]


def test_serve_warns_per_worker_kind_whose_cli_cannot_authenticate(
    corral: Corral, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "OPENAI_API_KEY",
        "CODEX_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    c = corral
    c.config.write_text(f"""roles:
  default: {{}}
  writer: {{worker: claude-code, tools: [Read]}}
  coder: {{worker: codex, tools: [Read]}}
  other: {{worker: opencode, tools: [Read]}}
workers:
  claude-code: {{binary: {CLAUDE}}}
  codex: {{binary: {CLAUDE.with_name("codex")}, env: {{OPENAI_API_KEY: sk-test-0123456789ab}}}}
  opencode: {{binary: /nonexistent/opencode}}
""")
    c.serve()
    log = eventually(lambda: "opencode" in c.engine_log() and c.engine_log(), what="the warnings")
    lines = [x for x in log.splitlines() if "WARNING" in x and ": its CLI " in x]
    assert len(lines) == 2, lines  # codex has its key
    assert (
        "worker claude-code: its CLI cannot authenticate: none of ANTHROPIC_API_KEY" in lines[0]
        and "not retried" in lines[0]
    )
    assert "worker opencode: its CLI '/nonexistent/opencode' is not found" in lines[1]
