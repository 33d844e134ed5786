"""Re-decomposition's pure rule (corral.waves.decompose) and the epic file's `on_exhausted`:
a valid proposal replaces the task with its own smaller tasks, rewires its dependents, and
gives the new tasks nothing an agent chose but ids, prompts and dependencies; a bad one is
refused naming the bad key (docs/how-to/epics.md)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.domain.epics import EpicState, TaskState
from corral.waves.decompose import ProposalError, replan
from corral.waves.epic import EpicFileError, load, parse
from corral.waves.rules import block_all, epic_end, settle

EPIC = """
name: greet
on_exhausted: [decompose, human]
tasks:
  - {id: base, role: coder, prompt: write base}
  - {id: a, role: coder, prompt: write a, depends_on: [base], checks: ["test -f a"],
     max_attempts: 2}
  - {id: b, role: coder, prompt: write b, depends_on: [base, a]}
  - {id: c, role: coder, prompt: write c, on_exhausted: strike}
"""


def test_on_exhausted_defaults_and_round_trip() -> None:
    spec = load(EPIC)
    assert [t.on_exhausted for t in spec.tasks] == [
        ("decompose", "human"),
        ("decompose", "human"),
        ("decompose", "human"),
        (),
    ]
    assert parse(spec.to_data()) == spec
    plain = load("name: x\ntasks: [{id: a, role: r, prompt: p}]")
    assert plain.tasks[0].on_exhausted == ()  # struck at once: the default
    assert plain.decomposer is None
    assert load("name: x\ndecomposer: planner\ntasks: [{id: a, role: r, prompt: p}]").decomposer


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("on_exhausted: retry", "on_exhausted: 'retry' is not strike, decompose or human"),
        ("on_exhausted: [human, nope]", "on_exhausted[1]: 'nope' is not"),
        ("on_exhausted: [human, human]", "on_exhausted: a step is named twice"),
        ("on_exhausted: 3", "on_exhausted: a list of strings is required"),
        ("decomposer: 'a b'", "decomposer: 'a b' does not match"),
    ],
)
def test_bad_on_exhausted_is_named(extra: str, message: str) -> None:
    with pytest.raises(EpicFileError) as err:
        load(f"name: x\n{extra}\ntasks: [{{id: a, role: r, prompt: p}}]")
    assert message in str(err.value)


def test_a_proposal_replaces_the_task_and_rewires_its_dependents() -> None:
    spec = load(EPIC)
    proposal = {
        "tasks": [
            {"id": "one", "prompt": "write half of a"},
            {"id": "two", "prompt": "write the rest of a", "depends_on": ["one"]},
        ]
    }
    plan = replan(spec, "a", proposal, waves_left=5)
    assert [t.id for t in plan.tasks] == ["base", "a", "a-one", "a-two", "b", "c"]
    one, two, b = plan.task("a-one"), plan.task("a-two"), plan.task("b")
    assert (one.depends_on, two.depends_on) == (("base",), ("base", "a-one"))
    assert b.depends_on == ("base", "a-two")  # not the replaced task any more
    assert (one.checks, two.checks) == ((), ("test -f a",))  # the last ones carry its checks
    assert {(t.role, t.max_attempts, t.on_exhausted) for t in (one, two)} == {
        ("coder", 2, ("human",))  # never re-decomposed again
    }
    assert parse(plan.to_data()) == plan

    # The replaced task is done when the tasks replacing it are.
    states = {t.id: TaskState.PASSED for t in plan.tasks} | {"a": TaskState.DECOMPOSED}
    assert epic_end(plan, states, 3) is EpicState.DONE
    open_b = states | {"b": TaskState.OPEN}
    assert block_all(plan, open_b)["b"] is TaskState.OPEN
    assert settle(TaskState.ESCALATED, TaskState.DECOMPOSED) is TaskState.DECOMPOSED


def one(**item: Any) -> dict[str, Any]:
    return {"tasks": [{"id": "x", "prompt": "p", **item}]}


@pytest.mark.parametrize(
    ("proposal", "waves_left", "message"),
    [
        ([], 5, 'a proposal is a JSON object {"tasks": [...]}'),
        ({"tasks": [], "why": "x"}, 5, "and nothing else"),
        ({"tasks": []}, 5, "tasks: a list of 1 to 10 tasks"),
        ({"tasks": [{"id": str(n), "prompt": "p"} for n in range(11)]}, 50, "1 to 10"),
        ({"tasks": ["x"]}, 5, "tasks[0]: a mapping is required"),
        (one(checks=["rm -rf /"]), 5, "tasks[0].checks: unknown key"),
        (one(role="admin"), 5, "tasks[0].role: unknown key"),
        ({"tasks": [{"id": "X!", "prompt": "p"}]}, 5, "tasks[0].id: a string matching"),
        ({"tasks": [{"id": "x", "prompt": " "}]}, 5, "tasks[0].prompt: a non-empty"),
        (one(depends_on="y"), 5, "tasks[0].depends_on: a list of proposed ids"),
        (one(depends_on=["b"]), 5, "tasks[0].depends_on[0]: no proposed task 'b'"),
        (
            {"tasks": [{"id": "x", "prompt": "p"}, {"id": "x", "prompt": "q"}]},
            5,
            "tasks[1].id: 'x' is named twice",
        ),
        (
            {
                "tasks": [
                    {"id": "x", "prompt": "p", "depends_on": ["y"]},
                    {"id": "y", "prompt": "q", "depends_on": ["x"]},
                ]
            },
            5,
            "the dependencies form a cycle",
        ),
        (
            {
                "tasks": [
                    {"id": "x", "prompt": "p"},
                    {"id": "y", "prompt": "q", "depends_on": ["x"]},
                ]
            },
            1,
            "need 2 waves in a row; the epic has 1 left",
        ),
        (one(id="one"), 5, "tasks[0].id: the epic has a task 'a-one' already"),
    ],
)
def test_a_bad_proposal_is_refused_naming_the_key(
    proposal: object, waves_left: int, message: str
) -> None:
    spec = load(EPIC)
    if "a-one" in message:  # a task of that id exists (an earlier re-decomposition's)
        spec = replan(spec, "a", one(id="one"), waves_left=5)
    with pytest.raises(ProposalError) as err:
        replan(spec, "a", proposal, waves_left=waves_left)
    assert message in str(err.value)


def test_a_proposal_cannot_exceed_the_epics_task_limit() -> None:
    many = "\n".join(f"  - {{id: t{n}, role: coder, prompt: p}}" for n in range(99))
    spec = load(f"name: big\ntasks:\n{many}\n")
    with pytest.raises(ProposalError, match="exceed the epic's limit of 100"):
        replan(spec, "t0", {"tasks": [{"id": i, "prompt": "p"} for i in "xy"]}, waves_left=5)
    with pytest.raises(EpicFileError, match="101 tasks, at most 100"):
        load(f"name: big\ntasks:\n{many}\n" + "\n".join(
            f"  - {{id: u{n}, role: coder, prompt: p}}" for n in range(2)
        ))  # fmt: skip
