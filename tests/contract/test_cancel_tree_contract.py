"""Cancellation down the execution topology (store/cascade.py), on every store: stopping a job
stops the jobs it submitted, with the reason on each; detached children and normal ends do not."""

from __future__ import annotations

import pytest

from corral.core.ports import Store
from corral.domain.errors import Conflict
from corral.domain.models import JobOptions
from corral.domain.states import JobState, Outcome
from tests.contract.test_store_contract import (
    NOW,
    UseStore,
    end_attempt,
    kinds,
    start,
    submit,
)


async def tree(store: Store) -> dict[str, str]:
    """A parent (running) with a running child, a queued child, a detached child and a
    grandchild under the running child; their ids by name."""
    parent = await submit(store)
    await start(store, parent)
    running = await submit(store, parent_id=parent.id, depth=1)
    await start(store, running)
    queued = await submit(store, parent_id=parent.id, depth=1)
    detached = await submit(store, parent_id=parent.id, depth=1, options=JobOptions(detached=True))
    grandchild = await submit(store, parent_id=running.id, depth=2)
    return {
        "parent": parent.id,
        "running": running.id,
        "queued": queued.id,
        "detached": detached.id,
        "grandchild": grandchild.id,
    }


@pytest.mark.parametrize(
    ("kind", "stopped"), [("cancel", JobState.CANCELLED), ("kill", JobState.KILLED)]
)
def test_stopping_a_parent_stops_every_descendant_with_the_reason(
    use_store: UseStore, kind: str, stopped: JobState
) -> None:
    async def body(store: Store) -> None:
        ids = await tree(store)
        await store.request_cancel(ids["parent"], reason="operator", kind=kind, now=NOW + 1)
        running = await store.get_job(ids["running"])
        assert running.state is JobState.RUNNING  # flagged: the engine stops its process
        assert (
            running.cancel_requested == f"parent {ids['parent']} was "
            f"{'cancelled' if kind == 'cancel' else 'killed'}"
            ": operator"
        )
        assert running.stop_kind == kind
        queued = await store.get_job(ids["queued"])
        assert queued.state is stopped and queued.last_error == running.cancel_requested
        grandchild = await store.get_job(ids["grandchild"])
        assert grandchild.state is stopped
        assert grandchild.last_error is not None
        assert grandchild.last_error.startswith(f"parent {ids['running']} was ")
        detached = await store.get_job(ids["detached"])
        assert detached.state is JobState.QUEUED and detached.cancel_requested is None
        assert f"{kind}_requested" in await kinds(store, ids["running"])

    use_store(body)


def test_a_parent_that_times_out_stops_its_children_one_that_succeeds_does_not(
    use_store: UseStore,
) -> None:
    async def body(store: Store) -> None:
        for ended, outcome, reached in (
            (JobState.TIMED_OUT, Outcome.TIMED_OUT, True),
            (JobState.SUCCEEDED, Outcome.EXITED, False),
            (JobState.FAILED, Outcome.EXITED, False),
        ):
            parent = await submit(store)
            c = await start(store, parent)
            child = await submit(store, parent_id=parent.id, depth=1)
            await start(store, child)
            await end_attempt(
                store,
                c,
                ended,
                outcome=outcome,
                exit_code=0 if ended is JobState.SUCCEEDED else 1,
                error="deadline" if reached else None,
            )
            after = await store.get_job(child.id)
            if reached:
                assert after.cancel_requested == f"parent {parent.id} timed out: deadline"
            else:
                assert after.cancel_requested is None and after.state is JobState.RUNNING

    use_store(body)


def test_a_parent_being_stopped_cannot_submit_children(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        parent = await submit(store)
        await start(store, parent)
        await store.request_cancel(parent.id, reason="operator", kind="cancel", now=NOW + 1)
        with pytest.raises(Conflict, match=f"parent {parent.id} is being stopped"):
            await submit(store, parent_id=parent.id, depth=1)
        detached = await submit(
            store, parent_id=parent.id, depth=1, options=JobOptions(detached=True)
        )
        assert detached.state is JobState.QUEUED

    use_store(body)
