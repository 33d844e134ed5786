"""The world model's pure part: the snapshot built from records, and the deadlock detector's
cycle shapes (dependencies, a parent following its child, slot starvation)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.domain.agents import Checkpoint
from corral.domain.models import Attempt, Job, JobOptions, Limits
from corral.domain.states import AttemptState, DedupMode, JobState
from corral.world.model import Caps, Edge, build, find_deadlocks

NOW = 1_000.0  # the fake clock: every snapshot is taken at this instant
CAPS = Caps(roles={"planner": 1, "coder": 2}, envs={"local": ("local", 4)})
Q, R, S = JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED


def job(id_: str, state: JobState = R, **kw: Any) -> Job:
    fields: dict[str, Any] = {
        "id": id_,
        "state": state,
        "role": "coder",
        "worker": "process",
        "env_name": "local",
        "priority": 2,
        "tenant": "default",
        "command": ("true",),
        "prompt": None,
        "cwd": None,
        "env": {},
        "options": JobOptions(),
        "limits": Limits(),
        "key": None,
        "dedup": DedupMode.COALESCE,
        "workspace": None,
        "parent_id": None,
        "depth": 0,
        "created_at": NOW - 10,
        "updated_at": NOW - 5,
        "sort_at": NOW - 10,
        "attempts": 1 if state is not Q else 0,
    }
    fields.update(kw)
    return Job(**fields)


def attempt(j: Job) -> Attempt:
    return Attempt(
        id=f"a-{j.id}",
        job_id=j.id,
        index=1,
        state=AttemptState.RUNNING,
        permit_id="p",
        deadline_at=NOW + 100,
        created_at=NOW - 9,
        dir="/nowhere",
        engine_id="e",
        started_at=NOW - 8,
    )


def world(jobs: list[Job], waits: dict[str, list[str]] | None = None, caps: Caps = CAPS) -> Any:
    inflight = [(j, attempt(j)) for j in jobs if j.state.in_flight]
    return build(jobs, inflight, {}, waits or {}, caps, now=NOW)


def kinds(w: Any) -> set[tuple[str, str, str]]:
    return {(e.kind, e.source, e.target) for e in w.edges}


def test_the_snapshot_shows_agents_with_their_latest_checkpoint() -> None:
    j = job("j1", role="planner")
    cp = Checkpoint(
        job_id="j1",
        attempt=1,
        at=NOW - 1,
        worker="claude",
        session_id="sess-1",
        tool_call_count=7,
        last_tool="Bash",
        last_output_digest=None,
    )
    w = build([j], [(j, attempt(j))], {"j1": cp}, {}, CAPS, now=NOW)
    (agent,) = w.agents
    assert (agent.job_id, agent.role, agent.state, agent.tool_calls) == ("j1", "planner", R, 7)
    assert (agent.current_tool, agent.session_id, agent.started_at) == ("Bash", "sess-1", NOW - 8)
    assert w.at == NOW


def test_an_environment_shows_in_flight_against_its_cap_and_its_queue() -> None:
    jobs = [job("r1"), job("r2"), job("q1", Q), job("q2", JobState.RETRY_WAIT), job("d", S)]
    (env,) = world(jobs).environments
    assert (env.name, env.kind, env.inflight, env.cap, env.queued) == ("local", "local", 2, 4, 2)
    assert env.cluster_status is None and env.gpu_utilisation is None


def test_queue_depths_counted_apart_replace_the_jobs_counted() -> None:
    jobs = [job("r1"), job("q1", Q)]  # a snapshot that read only some of the queued jobs
    w = build(jobs, [(jobs[0], attempt(jobs[0]))], {}, {}, CAPS, now=NOW, queued={"local": 40})
    assert [(e.name, e.queued) for e in w.environments] == [("local", 40)]
    w = build([], [], {}, {}, CAPS, now=NOW, queued={"gpu": 3, "local": 0})
    assert [(e.name, e.cap, e.queued) for e in w.environments] == [("gpu", 0, 3), ("local", 4, 0)]


def test_edges_say_who_spawned_who_and_who_waits() -> None:
    jobs = [
        job("p", role="planner"),
        job("c", Q, role="planner", parent_id="p", depth=1),
        job("after", Q, after=("p",), deps_pending=1),
        job("old", S, parent_id="p"),
    ]
    w = world(jobs, waits={"p": ["c", "old"]})
    assert kinds(w) == {
        ("spawned_by", "c", "p"),
        ("spawned_by", "old", "p"),
        ("blocked_by", "after", "p"),
        ("waits_for", "p", "c"),  # not on `old`: it ended
        ("waits_for_slot", "c", "p"),  # planner's one slot is p's
    }
    slot = next(e for e in w.edges if e.kind == "waits_for_slot")
    assert slot.slot == "role:planner"


def test_the_causal_graph_leads_each_job_back_to_its_root_intent() -> None:
    jobs = [job("a", S, exit_code=0), job("b", S, parent_id="a"), job("c", R, parent_id="b")]
    links = {c.job_id: c for c in world(jobs).causal}
    assert [links[j].root_id for j in "abc"] == ["a", "a", "a"]
    assert links["b"].outcome == "SUCCEEDED" and links["c"].outcome is None
    assert links["a"].exit_code == 0
    assert links["c"].user_plane.ray_submission_id is None  # nothing records one yet


def test_a_parent_waiting_on_a_child_that_needs_its_own_slot_is_a_deadlock() -> None:
    jobs = [job("p", role="planner"), job("c", Q, role="planner", parent_id="p", depth=1)]
    (dead,) = world(jobs, waits={"p": ["c"]}).deadlocks
    assert dead.jobs == ("c", "p")
    assert [(e.kind, e.source, e.target) for e in dead.edges] == [
        ("waits_for_slot", "c", "p"),
        ("waits_for", "p", "c"),
    ]
    assert dead.key == "c,p"


def test_a_parent_holding_the_slot_but_not_waiting_is_no_deadlock() -> None:
    jobs = [job("p", role="planner"), job("c", Q, role="planner", parent_id="p")]
    assert world(jobs).deadlocks == ()


def test_a_free_slot_held_by_someone_else_breaks_the_cycle() -> None:
    # coder has two slots: p holds one, x (not waiting on anything) the other
    jobs = [job("p"), job("x"), job("c", Q, parent_id="p")]
    w = world(jobs, waits={"p": ["c"]})
    assert ("waits_for_slot", "c", "x") in kinds(w)
    assert w.deadlocks == ()


def test_both_holders_waiting_is_slot_starvation() -> None:
    jobs = [job("p"), job("q"), job("c", Q, parent_id="p")]
    (dead,) = world(jobs, waits={"p": ["c"], "q": ["p"]}).deadlocks
    assert dead.jobs == ("c", "p")  # the shortest way round the group of three


E = Edge


@pytest.mark.parametrize(
    ("edges", "cycles"),
    [
        pytest.param([], [], id="nothing"),
        pytest.param([E(kind="blocked_by", source="a", target="b")], [], id="a chain"),
        pytest.param([E(kind="waits_for", source="a", target="a")], [("a",)], id="self"),
        pytest.param(
            [
                E(kind="blocked_by", source="a", target="b"),
                E(kind="waits_for", source="b", target="a"),
            ],
            [("a", "b")],
            id="two",
        ),
        pytest.param(
            [
                E(kind="waits_for", source="a", target="b"),
                E(kind="waits_for", source="b", target="c"),
                E(kind="blocked_by", source="c", target="a"),
                E(kind="blocked_by", source="x", target="a"),  # waits on the cycle, not in it
            ],
            [("a", "b", "c")],
            id="three and a bystander",
        ),
        pytest.param(
            [
                E(kind="waits_for", source="a", target="b"),
                E(kind="waits_for", source="b", target="a"),
                E(kind="waits_for", source="c", target="d"),
                E(kind="waits_for", source="d", target="c"),
            ],
            [("a", "b"), ("c", "d")],
            id="two apart",
        ),
        pytest.param(
            [
                *(E(kind="blocked_by", source=f"x{i}", target=f"x{i + 1}") for i in range(50)),
                E(kind="blocked_by", source="x50", target="a"),
                E(kind="waits_for", source="a", target="b"),
                E(kind="waits_for", source="b", target="a"),
                E(kind="waits_for", source="b", target="y"),  # and on one that waits on nothing
                E(kind="waits_for", source="y", target="z"),
            ],
            [("a", "b")],
            id="a long chain into a cycle and out of it",
        ),
        pytest.param(
            [
                E(kind="spawned_by", source="a", target="b"),
                E(kind="spawned_by", source="b", target="a"),
            ],
            [],
            id="spawning is no wait",
        ),
        pytest.param(
            [
                E(kind="waits_for", source="p", target="c"),
                E(kind="waits_for_slot", source="c", target="p", slot="role:r"),
                E(kind="waits_for_slot", source="c", target="x", slot="role:r"),
            ],
            [],
            id="slot with a free holder",
        ),
        pytest.param(
            [
                E(kind="waits_for", source="p", target="c"),
                E(kind="waits_for", source="x", target="p"),
                E(kind="waits_for_slot", source="c", target="p", slot="role:r"),
                E(kind="waits_for_slot", source="c", target="x", slot="role:r"),
            ],
            [("c", "p")],
            id="slot starvation by two holders",
        ),
    ],
)
def test_cycle_shapes(edges: list[Edge], cycles: list[tuple[str, ...]]) -> None:
    found = find_deadlocks(edges)
    assert [d.jobs for d in found] == cycles
    for d in found:  # each edge leads to the next job, the last back to the first
        assert [e.source for e in d.edges] == list(d.jobs)
        assert [e.target for e in d.edges] == [*d.jobs[1:], d.jobs[0]]


def test_a_queued_job_no_ancestor_of_which_holds_the_slot_just_waits_its_turn() -> None:
    jobs = [job("p", role="planner"), job("q", Q, role="planner")]  # q was not spawned by p
    w = world(jobs, waits={"p": ["q"]})
    assert ("waits_for_slot", "q", "p") not in kinds(w)
    assert w.environments[0].queued == 1


def test_a_queued_job_nobody_spawned_has_no_causal_link_yet() -> None:
    jobs = [job("p"), job("c", Q, parent_id="p"), job("q", Q), job("d", S)]
    assert {c.job_id for c in world(jobs).causal} == {"p", "c", "d"}
