"""The application services (services/) over the in-memory store: what every edge calls, with
plain arguments, getting domain values back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from corral.config import Config, load
from corral.core.ports import Store
from corral.domain.errors import Conflict, InvalidRequest, NotPermitted
from corral.domain.governance import ApprovalState, ScopeKind
from corral.domain.models import Job, JobSpec, Limits
from corral.domain.states import DedupMode, JobState
from corral.services import approvals, cancellation, controls, dlq, queries
from corral.services.submissions import (
    LimitChoices,
    SubmitRequest,
    spec_for,
    submissions,
    submit,
)
from corral.store.memory import MemoryStore
from tests.contract.test_store_contract import NOW, claim, ending, opened

CONFIG = """\
default_role: small
roles:
  small: {limits: {max_attempts: 2, timeout_s: 60, max_tool_calls: 7}}
  gated: {requires_approval: true}
"""


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    (tmp_path / "corral.yaml").write_text(CONFIG)
    return load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")


def run(body: Callable[[Store], Awaitable[None]]) -> None:
    """`await body(store)` on an opened in-memory store."""

    async def main() -> None:
        async with opened(MemoryStore()) as (store,):
            await body(store)

    anyio.run(main)


def ignore(op: str) -> None:
    """A wake nobody hears: no engine runs."""


async def queued(store: Store, cfg: Config, **spec: object) -> Job:
    return (
        await submissions(store, cfg).submit(JobSpec(command=("true",), role="small", **spec))
    ).job  # type: ignore[arg-type]


async def dead_lettered(store: Store, cfg: Config) -> Job:
    """A job whose only attempt failed into the dead-letter queue."""
    job = await queued(store, cfg)
    won = await store.start_attempts([claim(await store.get_job(job.id))], now=NOW)
    await store.finish([ending(won[0].attempt, JobState.DEAD_LETTERED, exit_code=1)], now=NOW + 3)
    return await store.get_job(job.id)


# ---- submissions ------------------------------------------------------------------------------


def test_a_request_takes_the_roles_limits_for_what_it_leaves_out(cfg: Config) -> None:
    spec = spec_for(
        SubmitRequest(command=("make",), limits=LimitChoices(timeout_s=30)), cfg.settings
    )
    assert (spec.role, spec.env_name) == ("small", cfg.settings.default_env)
    assert spec.limits == Limits(max_attempts=2, timeout_s=30, max_tool_calls=7)
    other = spec_for(
        SubmitRequest(
            command=("make",), role="gated", resume_from="J1", secret_env=("B", "A", "B")
        ),
        cfg.settings,
    )
    assert other.limits == Limits() and other.role == "gated"
    assert other.options.to_json() == {"resume_from": "J1", "secret_env": ["A", "B"]}


def test_a_submission_whose_wake_up_an_engine_answered_says_one_serves(cfg: Config) -> None:
    async def body(store: Store) -> None:
        request = SubmitRequest(command=("true",), cwd=str(cfg.data_dir.parent))
        done = await submit(store, cfg, request, lambda op: {"ok": True})
        assert done.result.created and done.engine_serving

    run(body)


def test_submit_stores_the_job_wakes_the_engine_and_says_none_serves(cfg: Config) -> None:
    woken: list[str] = []

    async def body(store: Store) -> None:
        request = SubmitRequest(command=("true",), cwd=str(cfg.data_dir.parent))
        done = await submit(store, cfg, request, woken.append)
        job = await store.get_job(done.result.job.id)
        assert done.result.created and job.state is JobState.QUEUED
        assert job.limits.max_attempts == 2 and not done.engine_serving
        assert woken == ["submitted"]

    run(body)


def test_a_submission_that_ends_a_job_wakes_the_engine_to_report_it(cfg: Config) -> None:
    """A job superseded (latest-wins) or one that fails its dependency at once is a "wake": the
    engine writes its report; a plain submission only needs a dispatch ("submitted")."""
    woken: list[str] = []

    async def body(store: Store) -> None:
        cwd = str(cfg.data_dir.parent)
        first = SubmitRequest(command=("true",), cwd=cwd, key="k")
        await submit(store, cfg, first, woken.append)
        latest = SubmitRequest(command=("true",), cwd=cwd, key="k", dedup=DedupMode.LATEST_WINS)
        done = await submit(store, cfg, latest, woken.append)
        assert done.result.superseded is not None
        failed = await dead_lettered(store, cfg)
        after = SubmitRequest(command=("true",), cwd=cwd, after=(failed.id,))
        ended = (await submit(store, cfg, after, woken.append)).result.job
        assert ended.state.terminal
        assert woken == ["submitted", "wake", "wake"]

    run(body)


# ---- cancellation -----------------------------------------------------------------------------


def test_cancel_ends_a_queued_job_and_refuses_one_already_ended(cfg: Config) -> None:
    async def body(store: Store) -> None:
        job = await queued(store, cfg)
        woken: list[str] = []
        done = await cancellation.cancel(
            store, cfg, job.id, reason="no", caller=None, wake=woken.append
        )
        assert done.job.state is JobState.CANCELLED and done.job.cancel_requested == "no"
        assert woken == ["wake"] and not done.engine_answered
        with pytest.raises(Conflict, match="already CANCELLED; nothing to cancel"):
            await cancellation.cancel(
                store, cfg, job.id, reason="again", caller=None, wake=woken.append
            )
        assert woken == ["wake"], "a refused cancel wakes nobody"

    run(body)


def test_a_job_may_cancel_its_descendants_and_no_other_job(cfg: Config) -> None:
    async def body(store: Store) -> None:
        parent = await queued(store, cfg)
        child = await queued(store, cfg, parent_id=parent.id)
        stranger = await queued(store, cfg)
        with pytest.raises(NotPermitted, match=f"job {stranger.id} may cancel itself"):
            await cancellation.cancel(
                store, cfg, parent.id, reason="r", caller=stranger.id, wake=ignore
            )
        assert (await store.get_job(parent.id)).state is JobState.QUEUED
        ended = await cancellation.cancel(
            store, cfg, child.id, reason="r", caller=parent.id, wake=ignore
        )
        assert ended.job.state is JobState.CANCELLED

    run(body)


# ---- approvals --------------------------------------------------------------------------------


def test_approving_a_gated_run_records_who_and_releases_the_job(cfg: Config) -> None:
    async def body(store: Store) -> None:
        job = (await submissions(store, cfg).submit(JobSpec(command=("true",), role="gated"))).job
        assert job.state is JobState.AWAITING_APPROVAL
        [pending] = await approvals.list_approvals(store, state="pending", job=job.id)
        decided = await approvals.decide(
            store, cfg, pending.id, approve=True, by="alice", wake=ignore, note="ok"
        )
        assert (decided.state, decided.decided_by, decided.note) == (
            ApprovalState.APPROVED,
            "alice",
            "ok",
        )
        assert (await store.get_job(job.id)).state is JobState.QUEUED
        assert await approvals.list_approvals(store, state="pending", job=None) == []

    run(body)


def test_denying_a_gated_run_denies_the_job_naming_who(cfg: Config) -> None:
    async def body(store: Store) -> None:
        job = (await submissions(store, cfg).submit(JobSpec(command=("true",), role="gated"))).job
        [pending] = await approvals.list_approvals(store, state=None, job=None)
        decided = await approvals.decide(
            store, cfg, pending.id, approve=False, by="bob", wake=ignore
        )
        assert (decided.state, decided.decided_by) == (ApprovalState.DENIED, "bob")
        denied = await store.get_job(job.id)
        assert denied.state is JobState.DENIED and "denied by bob" in (denied.last_error or "")
        with pytest.raises(InvalidRequest, match="unknown approval state 'maybe'"):
            await approvals.list_approvals(store, state="maybe", job=None)

    run(body)


# ---- kill switches and pauses -----------------------------------------------------------------


def test_a_kill_switch_goes_on_and_off_recording_who(cfg: Config) -> None:
    woken: list[str] = []

    async def body(store: Store) -> None:
        on = await controls.kill_switch_on(
            store,
            scope=ScopeKind.TENANT,
            target="acme",
            reason="runaway",
            expires_in=None,
            by="carol",
            wake=woken.append,
            clock=lambda: NOW,
        )
        assert (on.created_by, on.target, on.expires_at) == ("carol", "acme", None)
        assert [s.id for s in await controls.kill_switches(store, clock=lambda: NOW)] == [on.id]
        with pytest.raises(
            InvalidRequest,
            match=f"no active kill switch in scope global; active: {on.id} \\(tenant acme\\)",
        ):
            await controls.kill_switch_off(
                store,
                switch_id=None,
                scope=ScopeKind.GLOBAL,
                target=None,
                by="carol",
                wake=woken.append,
                clock=lambda: NOW,
            )
        lifted = await controls.kill_switch_off(
            store,
            switch_id=on.id[-6:],
            scope=ScopeKind.GLOBAL,
            target=None,
            by="dave",
            wake=woken.append,
            clock=lambda: NOW + 1,
        )
        assert [s.id for s in lifted] == [on.id]
        assert await controls.kill_switches(store, clock=lambda: NOW + 2) == []
        assert (
            await controls.kill_switch_off(
                store,
                switch_id=None,
                scope=ScopeKind.GLOBAL,
                target=None,
                by="dave",
                wake=woken.append,
            )
            == []
        )
        assert woken == ["wake"] * 3, "each change wakes the engine; a refusal does not"

    run(body)


def test_a_scope_names_its_target_and_global_takes_none(cfg: Config) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(InvalidRequest, match="--scope global takes no --target"):
            await controls.pause(
                store, scope=ScopeKind.GLOBAL, target="x", reason="r", by="op", wake=ignore
            )
        with pytest.raises(InvalidRequest, match="--scope role needs --target"):
            await controls.pause(
                store, scope=ScopeKind.ROLE, target=None, reason="r", by="op", wake=ignore
            )
        p = await controls.pause(
            store, scope=ScopeKind.ROLE, target="small", reason="r", by="op", wake=ignore
        )
        assert [
            q.id
            for q in await controls.resume(
                store, scope=ScopeKind.ROLE, target="small", by="op", wake=ignore
            )
        ] == [p.id]

    run(body)


# ---- dead-letter queue ------------------------------------------------------------------------


def test_dlq_requeue_makes_a_fresh_job_and_purge_resolves_the_rest(cfg: Config) -> None:
    async def body(store: Store) -> None:
        first, second, third = [await dead_lettered(store, cfg) for _ in range(3)]
        fresh = await dlq.requeue(store, cfg, first.id, wake=ignore)
        assert fresh.id != first.id and fresh.requeued_from == first.id
        assert fresh.state is JobState.QUEUED and fresh.attempts == 0
        listed = await queries.jobs(store, dlq.dead_lettered(50))
        assert {j.id for j in listed.jobs} == {second.id, third.id}
        assert await dlq.purge(store, cfg, [second.id, second.id]) == [second.id]
        assert await dlq.purge(store, cfg, [], every=True) == [third.id]
        assert (await queries.jobs(store, dlq.dead_lettered(50))).jobs == []
        with pytest.raises(Conflict):
            await dlq.requeue(store, cfg, first.id, wake=ignore)

    run(body)


# ---- read models ------------------------------------------------------------------------------


def test_job_detail_holds_the_job_its_attempts_and_its_timeline(cfg: Config) -> None:
    async def body(store: Store) -> None:
        job = await dead_lettered(store, cfg)
        d = await queries.job_detail(store, job.id[-8:])
        assert d.job.id == job.id and d.job.state is JobState.DEAD_LETTERED
        assert [a.index for a in d.attempts] == [1]
        assert d.timeline[0].kind == "submitted" and d.timeline[-1].to_state == "DEAD_LETTERED"
        assert d.agent_events == []
        listed = await queries.jobs(store, dlq.dead_lettered(10), short=True)
        assert set(listed.short) == {job.id}

    run(body)


def test_a_policy_filter_checks_its_values() -> None:
    with pytest.raises(InvalidRequest, match="--verdict must be one of"):
        queries.policy_filter(verdict="maybe")
    with pytest.raises(InvalidRequest, match="--limit must be at least 1"):
        queries.policy_filter(limit=0)
    with pytest.raises(InvalidRequest, match="--since is seconds ago"):
        queries.policy_filter(since_s=-1)
    assert queries.policy_filter(since_s=10, clock=lambda: NOW).since == NOW - 10


# ---- budgets and dark launches ----------------------------------------------------------------


def test_a_budget_ceiling_is_checked_field_by_field_in_order() -> None:
    with pytest.raises(InvalidRequest, match="--scope must be tenant or role, not 'job'"):
        controls.budget_ceiling(scope="job", target="", period="x", ceiling_usd=-1)
    with pytest.raises(InvalidRequest, match="--target is empty"):
        controls.budget_ceiling(scope="role", target=" ", period="x", ceiling_usd=-1)
    with pytest.raises(InvalidRequest, match="--period must be one of daily, monthly"):
        controls.budget_ceiling(scope="role", target="small", period="x", ceiling_usd=-1)
    ceiling = controls.budget_ceiling(scope="role", target="small", period="daily", ceiling_usd=5)
    assert (ceiling.scope, ceiling.ceiling_usd) == (ScopeKind.ROLE, 5)


def test_setting_a_budget_returns_the_one_it_replaced_and_the_standing(cfg: Config) -> None:
    async def body(store: Store) -> None:
        first = controls.budget_ceiling(scope="role", target="small", period="daily", ceiling_usd=5)
        previous, line = await controls.set_budget(store, first, by="op", wake=ignore)
        assert previous is None and line.headroom_usd == 5 and line.resets_at is not None
        second = controls.budget_ceiling(
            scope="role", target="small", period="rolling_30d", ceiling_usd=9
        )
        previous, line = await controls.set_budget(store, second, by="op", wake=ignore)
        assert previous == first and line.resets_at is None
        [only] = await controls.budgets(store, scope=ScopeKind.ROLE, target=None)
        assert only.ceiling == second

    run(body)


def test_a_dark_launch_lets_a_workflow_run_by_its_position(cfg: Config) -> None:
    async def body(store: Store) -> None:
        unset = await controls.dark_launch(store, "wf-1")
        assert unset.setting is None and unset.in_window is None and unset.runs
        none = await controls.set_dark_launch(
            store, "wf-1", percentage=0, enabled=True, by="op", wake=ignore
        )
        assert none.in_window is False and not none.runs
        off = await controls.set_dark_launch(
            store, "wf-1", percentage=None, enabled=False, by="op", wake=ignore
        )
        assert off.setting is not None and off.setting.percentage == 0 and off.runs
        with pytest.raises(InvalidRequest, match="--percentage must be 0 … 100, not 101"):
            await controls.set_dark_launch(
                store, "wf-1", percentage=101, enabled=True, by="op", wake=ignore
            )
        assert [s.workflow for s in await controls.dark_launches(store)] == ["wf-1"]

    run(body)
