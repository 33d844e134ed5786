"""Why a job waits, table-tested (scheduler/waiting.py is a pure function)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.domain.governance import Pause, ScopeKind
from corral.domain.models import JobEvent
from corral.domain.states import JobState
from corral.scheduler.waiting import Wait, WaitFacts, clock, why
from tests.unit.test_retry import job

NOW = 1_700_000_000.0


def refusal(
    reason: str, message: str, retry_after_s: float | None = None, at: float = NOW - 10
) -> JobEvent:
    return JobEvent(
        job_id="j1",
        at=at,
        kind="permit_rejected",
        message=message,
        attempt=1,
        data={"reason": reason, "retry_after_s": retry_after_s},
    )


def facts(state: JobState = JobState.QUEUED, **kw: Any) -> WaitFacts:
    fields = {
        k: kw.pop(k) for k in ("attempts", "deps_pending", "retry_at", "last_error") if k in kw
    }
    return WaitFacts(job=job(state=state, **{"attempts": 0, **fields}), now=NOW, **kw)


PAUSE = Pause(
    id="p1",
    scope=ScopeKind.ROLE,
    target="r",
    reason="maintenance",
    created_at=NOW - 60,
    created_by="op",
)
OPEN = {"worker:command": {"state": "OPEN", "retry_after_s": 28.0}}


@pytest.mark.parametrize(
    ("f", "code", "text"),
    [
        (facts(JobState.SUCCEEDED), "ended", "succeeded"),
        (facts(JobState.DEAD_LETTERED), "ended", "dead lettered"),
        (
            facts(engine=False, data_dir="/d"),
            "no_engine",
            "no engine is serving /d: start `corral serve`",
        ),
        (facts(JobState.RUNNING, engine=False, attempts=1), "running", "running attempt 1 of 4"),
        (
            facts(JobState.AWAITING_APPROVAL),
            "awaiting_approval",
            "awaiting a human's approval: corral approvals list --job j1",
        ),
        (
            facts(
                JobState.RETRY_WAIT, attempts=2, retry_at=NOW + 5, last_error="exited with code 1"
            ),
            "retry_wait",
            f"attempt 2 of 4 failed (exited with code 1); next at {clock(NOW + 5, NOW)}",
        ),
        (facts(JobState.STARTING, attempts=1), "starting", "starting attempt 1"),
        (facts(deps_pending=2), "dependencies", "waiting for 2 job(s) it runs --after to succeed"),
        (
            facts(pauses=(PAUSE,)),
            "paused",
            "paused (role r: maintenance); `corral resume` lifts it",
        ),
        (facts(ahead=3), "queued", "queued behind 3 job(s)"),
        (facts(), "queued", "queued: next to start"),
        (
            facts(full_roles=frozenset({"r"})),
            "at_capacity",
            "role r is at its concurrency cap: waits for a running job to end",
        ),
        # an open breaker: when it lets a probe through, from the engine's live view …
        (
            facts(
                refusal=refusal("CIRCUIT_OPEN", "breaker worker:command is OPEN", 5.0),
                breakers=OPEN,
            ),
            "breaker_open",
            f"breaker worker:command is OPEN until {clock(NOW + 28, NOW)}: its worker failed; "
            "`corral breakers` shows why",
        ),
        # … or from the refusal the timeline recorded, without an engine's view
        (
            facts(refusal=refusal("CIRCUIT_OPEN", "breaker worker:command is OPEN", 30.0)),
            "breaker_open",
            f"breaker worker:command is OPEN until {clock(NOW + 20, NOW)}: its worker "
            "failed; `corral breakers` shows why",
        ),
        (
            facts(
                refusal=refusal("CIRCUIT_OPEN", "…"),
                breakers={"worker:command": {"state": "HALF_OPEN"}},
            ),
            "breaker_open",
            "breaker worker:command is HALF_OPEN: one probe runs first, the rest wait for its "
            "result",
        ),
        (
            facts(
                refusal=refusal("CIRCUIT_OPEN", "…"),
                breakers={"worker:command": {"state": "CLOSED"}},
            ),
            "queued",
            "breaker worker:command closed again: next round starts it",
        ),
        (
            facts(refusal=refusal("RATE_LIMIT", "rate limit: role:r out of tokens", 15.0)),
            "permit_refused",
            "the core refuses a permit (RATE_LIMIT): rate limit: role:r out of "
            f"tokens; again at {clock(NOW + 5, NOW)}",
        ),
        (
            facts(
                refusal=refusal("FATAL_MODE", "worker kind command is isolated by escalation e1")
            ),
            "permit_refused",
            "the core refuses a permit (FATAL_MODE): worker kind command is isolated "
            "by escalation e1",
        ),
    ],
)
def test_why_a_job_waits(f: WaitFacts, code: str, text: str) -> None:
    w = why(f)
    assert (w.code, w.text) == (code, text)


def test_only_what_is_not_the_queue_itself_is_a_block() -> None:
    assert not Wait(code="queued", text="").blocked
    assert Wait(code="breaker_open", text="").blocked and Wait(code="paused", text="").blocked


@pytest.mark.parametrize(("left", "span"), [(28.4, "28s"), (125, "2m05s"), (7300, "2h01m")])
def test_clock_says_when_and_how_long(left: float, span: str) -> None:
    assert clock(NOW + left, NOW).endswith(f"(in {span})")
    assert "(in" not in clock(NOW - 1, NOW)
