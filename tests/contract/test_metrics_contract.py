"""The metrics reads (`MetricsReads.fleet_figures`): the same aggregates from every store, each
checked against what the store's own job and attempt reads say."""

from __future__ import annotations

from corral.core.ports import Store, Tally
from corral.domain.agents import AgentEvent, PolicyEvaluation
from corral.domain.states import JobState
from tests.contract.test_store_contract import NOW, UseStore, end, ending, start, submit

BOUNDS = (0.5, 1.0, 5.0, 3600.0)


def _by(tallies: tuple[Tally, ...]) -> dict[tuple[str, ...], float]:
    return {t.labels: t.value for t in tallies}


def test_fleet_figures_aggregate_jobs_attempts_tool_calls_and_usage(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert (await store.fleet_figures(BOUNDS)).jobs == ()
        await submit(store, role="coder", env_name="dev", priority=3, at=NOW - 30)
        await submit(store, role="coder", env_name="dev", priority=3, at=NOW - 20)
        running = await submit(store, role="coder", env_name="dev", worker="claude", at=NOW - 10)
        await start(store, running)
        done = await submit(store, role="review", tenant="acme", worker="claude", at=NOW - 4)
        await end(store, done, JobState.SUCCEEDED)
        lost = await submit(store, role="review", at=NOW - 3)
        await end(store, lost, JobState.DEAD_LETTERED, exit_code=1)
        await store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=NOW,
                    job_id=done.id,
                    attempt=1,
                    stage="tool_call",
                    subject="Bash",
                    verdict="allow",
                    reason="allowed",
                ),
                PolicyEvaluation(
                    at=NOW,
                    job_id=done.id,
                    attempt=1,
                    stage="tool_call",
                    subject="Bash",
                    verdict="deny",
                    reason="out_of_scope",
                ),
                PolicyEvaluation(
                    at=NOW,
                    job_id=done.id,
                    attempt=1,
                    stage="guardrail",
                    subject="Bash",
                    verdict="deny",
                    reason="guardrail",
                ),
                PolicyEvaluation(
                    at=NOW,
                    job_id=done.id,
                    attempt=1,
                    stage="guardrail",
                    subject="spawn",
                    verdict="deny",
                    reason="guardrail",
                ),
                PolicyEvaluation(
                    at=NOW,
                    job_id=done.id,
                    attempt=1,
                    stage="pre_run",
                    subject="kill_switch",
                    verdict="allow",
                    reason="allowed",
                ),
            ]
        )
        assert await store.record_agent_event(
            AgentEvent(
                event_id="e1",
                job_id=done.id,
                attempt=1,
                at=NOW,
                role="review",
                worker="claude",
                tenant="acme",
                tokens_in=120,
                tokens_out=30,
                cost_usd=0.25,
            )
        )

        f = await store.fleet_figures(BOUNDS)
        jobs = _by(f.jobs)
        assert jobs[("coder", "dev", "3", "QUEUED")] == 2
        assert jobs[("review", "local", str(done.priority), "SUCCEEDED")] == 1
        assert jobs[("review", "local", str(lost.priority), "DEAD_LETTERED")] == 1
        assert sum(jobs.values()) == 5
        assert _by(f.dlq) == {("review",): 1}
        assert _by(f.inflight) == {("coder", "dev", "claude"): 1}
        assert _by(f.attempts) == {("coder",): 1, ("review",): 2}
        assert _by(f.retries) == {("coder",): 0, ("review",): 0}
        assert _by(f.tool_calls) == {
            ("allow", "allowed"): 1,
            ("deny", "out_of_scope"): 1,
            ("deny", "guardrail"): 1,
        }
        assert f.usage == ((("review", "acme", "claude"), 120, 30, 0.25),)

        runs = {d.labels: d for d in f.attempt_seconds}
        review = [a for j in (done, lost) for a in await store.attempts(j.id)]
        durations = [
            a.ended_at - a.started_at
            for a in review
            if a.ended_at is not None and a.started_at is not None
        ]
        assert runs[("review",)].observed == len(durations) == 2
        assert runs[("review",)].total == sum(durations)
        assert runs[("review",)].cumulative == tuple(
            sum(1 for d in durations if d <= b) for b in BOUNDS
        )
        assert runs[("coder",)].observed == 0  # still running
        waits = {d.labels: d for d in f.start_seconds}
        [first] = await store.attempts(running.id)
        assert first.started_at is not None
        assert waits[("coder",)].observed == 1
        assert waits[("coder",)].total == first.started_at - (NOW - 10)
        assert waits[("coder",)].cumulative[-1] == 1
        # settled attempts are folded into rollups by the first read (SQL stores): reading
        # again, after the running attempt ended too, counts each attempt once
        assert await store.fleet_figures(BOUNDS) == f
        c = await store.finish(
            [ending((await store.attempts(running.id))[0], JobState.SUCCEEDED)], now=NOW + 3
        )
        assert [j.id for j in c] == [running.id]
        again = await store.fleet_figures(BOUNDS)
        assert _by(again.attempts) == {("coder",): 1, ("review",): 2}
        assert {d.labels: d.observed for d in again.attempt_seconds} == {
            ("coder",): 1,
            ("review",): 2,
        }
        assert await store.fleet_figures(BOUNDS) == again

    use_store(body)
