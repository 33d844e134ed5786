"""The lifecycle table: nothing leaves a terminal state, nothing goes backwards."""

from __future__ import annotations

import pytest

from corral.domain.states import JOB_TRANSITIONS, TERMINAL, JobState, can_transition

ORDER = [
    JobState.SUBMITTED,
    JobState.AWAITING_APPROVAL,
    JobState.QUEUED,
    JobState.STARTING,
    JobState.RUNNING,
]


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_no_edge_leaves_a_terminal_state(state: JobState) -> None:
    assert state not in JOB_TRANSITIONS
    assert not any(can_transition(state, dst) for dst in JobState)


def test_the_only_backward_edge_is_the_retry_loop() -> None:
    backward = [
        (src, dst)
        for src, dsts in JOB_TRANSITIONS.items()
        for dst in dsts
        if src in ORDER and dst in ORDER and ORDER.index(dst) < ORDER.index(src)
    ]
    assert backward == []
    assert can_transition(JobState.RUNNING, JobState.RETRY_WAIT)
    assert JOB_TRANSITIONS[JobState.RETRY_WAIT] == {
        JobState.QUEUED,
        JobState.CANCELLED,
        JobState.KILLED,
    }


def test_every_state_is_reachable_from_submitted() -> None:
    seen, todo = {JobState.SUBMITTED}, [JobState.SUBMITTED]
    while todo:
        for dst in JOB_TRANSITIONS.get(todo.pop(), ()):
            if dst not in seen:
                seen.add(dst)
                todo.append(dst)
    assert seen == set(JobState)
