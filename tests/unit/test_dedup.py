"""What a submission does about a held idempotency key (a pure decision, table-tested)."""

from __future__ import annotations

import pytest

from corral.domain.errors import DuplicateJob, InvalidRequest
from corral.domain.states import DedupMode, JobState
from corral.scheduler.dedup import on_held_key
from tests.unit.test_retry import job

HOLDER = job(id="h", key="k", state=JobState.RUNNING)


@pytest.mark.parametrize(
    ("mode", "holder", "expected"),
    [
        (DedupMode.COALESCE, None, "new"),
        (DedupMode.REJECT, None, "new"),
        (DedupMode.COALESCE, HOLDER, "coalesce"),
        (DedupMode.LATEST_WINS, HOLDER, "supersede"),
        (DedupMode.REJECT, job(id="h", key="k", state=JobState.SUCCEEDED), "new"),
        (DedupMode.COALESCE, job(id="h", key="k", state=JobState.RETRY_WAIT), "coalesce"),
    ],
)
def test_decision(mode: DedupMode, holder: object, expected: str) -> None:
    assert on_held_key(job(id="n", key="k", dedup=mode), holder) == expected  # type: ignore[arg-type]


def test_reject_names_the_holder_and_latest_wins_cannot_wait_on_what_it_replaces() -> None:
    with pytest.raises(DuplicateJob, match="held by job h"):
        on_held_key(job(id="n", key="k", dedup=DedupMode.REJECT), HOLDER)
    with pytest.raises(InvalidRequest, match="supersedes"):
        on_held_key(job(id="n", key="k", dedup=DedupMode.LATEST_WINS, after=("h",)), HOLDER)
