"""What a new operator meets in the first hour, through the real `corral` command: the README's
Quickstart run in order, its failing examples included, and what `corral` says on the way."""

from __future__ import annotations

import json
from typing import Any

from tests.acceptance.conftest import Corral


def _breakers(c: Corral) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(c.ok("breakers", "--json"))
    return found


def test_the_quickstarts_failing_jobs_leave_the_command_breaker_closed(corral: Corral) -> None:
    c = corral
    c.serve()
    assert c.run("submit", "--wait", "--timeout", "1", "--", "sleep", "60").returncode == 124
    failing = (["sh", "-c", "exit 3"], ["make", "report"], ["sh", "-c", "kill -9 $$"],
               ["no-such-program-4f1c"])
    for argv in failing:  # each retried once (but the program that does not exist)
        assert c.run("submit", "--wait", "--max-attempts", "2", "--", *argv).returncode != 0
    hello = c.ok("submit", "--wait", "--json", "--", "echo", "hi")
    job = json.loads(hello)["id"]
    assert c.job(job)["state"] == "SUCCEEDED"
    assert all(b["state"] == "CLOSED" for b in _breakers(c)), _breakers(c)
    assert json.loads(c.ok("events", "--kind", "breaker", "--json")) == []
    assert json.loads(c.ok("escalations", "list", "--json")) == [], "no crash loop either"
    faults = [e["data"].get("fault") for j in json.loads(c.ok("jobs", "--json"))
              for e in c.job(j["id"])["timeline"] if e["kind"] == "attempt_ended"]
    assert sorted(faults, key=str) == [None] + ["job"] * 8, faults  # all the jobs' own
    verdicts = json.loads(c.ok("policy", "log", "--job", job, "--json"))
    # at submission, then once at dispatch: not once per dispatch round
    assert [(v["verdict"], v["reason"]) for v in verdicts] == [("allow", "allowed")] * 2
