"""The JSON a short command prints without pydantic (schemas/plain.py) is the JSON of the
views' models (schemas/views.py), value for value and type for type; anything plain cannot say
is dumped by the model."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from corral.cli import views as cli_views
from corral.domain import agents as da
from corral.domain import models as dm
from corral.domain.states import AttemptState, DedupMode, JobState, Outcome
from corral.schemas import plain
from corral.schemas import views as schemas
from tests.contract.test_store_contract import NOW, make_job

JOBS = [
    make_job(),
    make_job(
        state=JobState.FAILED,
        key="nightly",
        dedup=DedupMode.LATEST_WINS,
        after=("a", "b"),
        cwd="/w",
        prompt="do it",
        workspace="/ws",
        parent_id="p",
        depth=2,
        exit_code=3,
        last_error="boom",
        limit_hit="timeout",
        attempts=2,
        retry_at=NOW + 5,
        cancel_requested="operator",
        limits=dm.Limits(timeout_s=5, grace_s=1, max_attempts=3),  # ints in float fields
        options=dm.JobOptions(
            resume_from="j0",
            secret_env=("TOKEN",),
            detached=True,
            extra={"notebook": {"path": "a.ipynb", "params": {"n": 1}}, "training": "odd"},
        ),
    ),
]
ATTEMPTS = [
    dm.Attempt(
        id="a1",
        job_id="j",
        index=1,
        state=AttemptState.RUNNING,
        permit_id="p1",
        deadline_at=NOW + 60,
        created_at=NOW,
        dir="/d/a1",
        engine_id="e",
        pid=123,
        started_at=NOW + 0.5,
    ),
    dm.Attempt(
        id="a2",
        job_id="j",
        index=2,
        state=AttemptState.KILLED,
        permit_id="p2",
        deadline_at=NOW + 60,
        created_at=NOW,
        dir="/d/a2",
        engine_id="e",
        ended_at=NOW + 2,
        exit_code=-9,
        signal=9,
        outcome=Outcome.KILLED,
        error="killed",
        limit_hit="tokens",
    ),
]
EVENTS = [
    dm.JobEvent(job_id="j", at=NOW, kind="state", from_state="QUEUED", to_state="RUNNING"),
    dm.JobEvent(
        job_id="j",
        at=NOW + 1,
        kind="note",
        message="m",
        attempt=1,
        data={"nested": {"list": [1, 2.5, None, True], "tuple": (1, "x")}, "inf": math.inf},
    ),
]
AGENT_EVENTS = [
    da.AgentEvent(
        event_id="e1", job_id="j", attempt=1, at=NOW, role="r", worker="codex", tenant="t"
    ),
    da.AgentEvent(
        event_id="e2",
        job_id="j",
        attempt=2,
        at=NOW + 1,
        role="r",
        worker="claude-code",
        tenant="t",
        session_id="s",
        cli_version="2.1",
        model="m",
        tool_calls=(
            da.ToolCallTrace(tool="Bash", input={"command": "ls", "n": [1, 2]}, output="x"),
            da.ToolCallTrace(tool="Read", input={}, denied=True, reason="scope", duration_ms=4),
        ),
        tokens_in=10,
        tokens_out=5,
        cost_usd=0,  # an int in a float field
        exit_code=0,
        outcome="success",
        retry_count=1,
        checkpoint_count=2,
        duration_ms=1500,
        final_text="done",
        model_calls={"requests": 2, "cost_usd": 0.5},
    ),
]


def same(mine: dict[str, Any], model: dict[str, Any]) -> None:
    """Equal as JSON text: so a 5 where the model says 5.0 is a difference too."""
    assert json.dumps(mine, sort_keys=True) == json.dumps(model, sort_keys=True)


@pytest.mark.parametrize("job", JOBS, ids=["plain", "every-field"])
def test_a_job_and_its_detail(job: dm.Job) -> None:
    same(cli_views.job_json(job), schemas.Job.of(job).dump())
    same(cli_views.job_json(job, detail=True), schemas.JobDetail.of(job).dump())


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=["running", "ended"])
def test_an_attempt(attempt: dm.Attempt) -> None:
    same(cli_views.attempt_json(attempt), schemas.Attempt.of(attempt).dump())


@pytest.mark.parametrize("event", EVENTS, ids=["state", "data"])
def test_a_timeline_event(event: dm.JobEvent) -> None:
    same(cli_views.event_json(event), schemas.JobEvent.of(event).dump())


@pytest.mark.parametrize("event", AGENT_EVENTS, ids=["bare", "full"])
def test_an_agent_event(event: da.AgentEvent) -> None:
    same(cli_views.agent_event_json(event), schemas.AgentEvent.of(event).dump())


def test_what_plain_cannot_say_the_model_dumps() -> None:
    odd = replace(EVENTS[1], data={"when": {1, 2}})  # a set: JSON has none
    with pytest.raises(plain.NotPlain):
        plain.json(plain.job_event(odd))
    assert cli_views.event_json(odd) == schemas.JobEvent.of(odd).dump()
