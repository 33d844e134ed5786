"""Submissions against a role's retry budget and parentage (services/submissions.py)."""

from __future__ import annotations

import anyio
import pytest

from corral.core.ports import JobQuery
from corral.domain.errors import Backpressure, Conflict, InvalidRequest
from corral.domain.models import JobOptions, JobSpec, Limits
from corral.domain.settings import EnvSpec, RetryBudget, RoleSpec, Settings, ThrottleSpec
from corral.services.submissions import Submissions
from corral.store.memory import MemoryStore

SETTINGS = Settings(
    roles={
        "default": RoleSpec(name="default"),
        "capped": RoleSpec(
            name="capped",
            limits=Limits(max_attempts=2, timeout_s=60),
            retry_budget=RetryBudget(max_attempts=3, max_timeout_s=120),
        ),
        "loose": RoleSpec(name="loose", detached=True),
    },
    environments={"local": EnvSpec(name="local")},
)


def _svc() -> tuple[MemoryStore, Submissions]:
    store = MemoryStore()
    return store, Submissions(store, SETTINGS, lambda: 1000.0, frozenset({"command"}))


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            Limits(max_attempts=4, timeout_s=60),
            "max_attempts 4 is more than retry_budget.max_attempts 3 of role capped",
        ),
        (
            Limits(max_attempts=3, timeout_s=121),
            "timeout_s 121 is more than retry_budget.max_timeout_s 120 of role capped",
        ),
    ],
)
def test_limits_the_core_would_refuse_are_refused_at_submission(
    limits: Limits, message: str
) -> None:
    _, svc = _svc()
    with pytest.raises(InvalidRequest, match=message):
        svc.build(JobSpec(command=("x",), role="capped", limits=limits), 1000.0)
    assert svc.build(
        JobSpec(command=("x",), role="capped", limits=Limits(max_attempts=3, timeout_s=120)), 1000.0
    )


def test_only_a_detached_roles_child_is_marked_detached_and_only_by_the_role() -> None:
    async def main() -> None:
        _, svc = _svc()
        parent = (await svc.submit(JobSpec(command=("x",)))).job
        loose = (await svc.submit(JobSpec(command=("x",), role="loose", parent_id=parent.id))).job
        bound = (
            await svc.submit(
                JobSpec(command=("x",), parent_id=parent.id, options=JobOptions(detached=True))
            )
        ).job
        top = (await svc.submit(JobSpec(command=("x",), role="loose"))).job
        assert loose.options.detached is True and loose.depth == 1
        assert "detached" not in bound.options.to_json(), "a submitter cannot detach itself"
        assert "detached" not in top.options.to_json()

    anyio.run(main)


def test_a_parent_being_cancelled_cannot_submit_children() -> None:
    async def main() -> None:
        store, svc = _svc()
        parent = (await svc.submit(JobSpec(command=("x",)))).job
        await svc.cancel(parent.id, "operator")
        with pytest.raises(Conflict, match=f"parent {parent.id} ended CANCELLED"):
            await svc.submit(JobSpec(command=("x",), parent_id=parent.id))
        assert len(await store.list_jobs(JobQuery())) == 1

    anyio.run(main)


def test_a_burst_is_throttled_before_its_queue_fills_and_released_after() -> None:
    """Predictive throttling at submission (corral.world.throttle), on a fake clock: two jobs a
    second into an environment whose queue holds 40 are refused long before 40 wait, with a
    retry-after; priority 0 still passes; once the burst is past the window the forecast drops
    and the next submission is admitted. Every decision is a policy evaluation."""
    now = [1000.0]
    settings = Settings(
        roles={"default": RoleSpec(name="default")},
        environments={
            "local": EnvSpec(
                name="local",
                max_queued=40,
                throttle=ThrottleSpec(threshold=0.5, release=0.35, window_s=10, horizon_s=10),
            )
        },
    )
    store = MemoryStore()
    svc = Submissions(store, settings, lambda: now[0], frozenset({"command"}))

    async def main() -> None:
        admitted = 0
        refusal = None
        for _ in range(40):
            now[0] += 0.5
            try:
                await svc.submit(JobSpec(command=("true",)))
                admitted += 1
            except Backpressure as err:
                refusal = err
                break
        assert refusal is not None and 0 < admitted < 20  # far from the 40 the queue holds
        assert str(refusal).startswith("throttled: environment local:")
        assert "environments.local.throttle" in str(refusal) and refusal.retry_after_s >= 1
        (evaluation,) = await store.recent_policy_evaluations(stage="throttle")
        assert (evaluation.verdict, evaluation.reason, evaluation.subject) == (
            "deny",
            "throttled",
            "env:local",
        )
        assert evaluation.inputs["depth"] == admitted and evaluation.inputs["cap"] == 40
        assert evaluation.inputs["predicted"] >= 20
        urgent = await svc.submit(JobSpec(command=("true",), priority=0))
        assert urgent.created  # priority 0 passes …
        now[0] += 1
        with pytest.raises(Backpressure):  # … the others are still refused
            await svc.submit(JobSpec(command=("true",)))
        now[0] += 30  # the burst has left the window: the queue no longer grows
        later = await svc.submit(JobSpec(command=("true",)))
        assert later.created
        reasons = [e.reason for e in await store.recent_policy_evaluations(stage="throttle")]
        assert reasons == ["throttled", "priority_0", "still_throttled", "released"]
        await svc.submit(JobSpec(command=("true",)))  # admitted, and not worth an evaluation
        assert len(await store.recent_policy_evaluations(stage="throttle")) == 4
        assert len(await store.list_jobs(JobQuery(limit=100))) == admitted + 3

    anyio.run(main)
