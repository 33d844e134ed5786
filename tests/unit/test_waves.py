"""The ratchet's pure rules (corral.waves): the epic file's errors name the bad key, and the
council, gate, escalation, find and end rules as tables (docs/how-to/epics.md)."""

from __future__ import annotations

import pytest

from corral.domain.epics import EpicState, TaskState
from corral.domain.errors import InvalidRequest
from corral.waves.epic import EpicFileError, load, parse
from corral.waves.rules import (
    Consensus,
    Gate,
    JudgeVerdict,
    Verdict,
    VerdictError,
    after_failure,
    block_all,
    council,
    epic_end,
    gate,
    read_verdict,
    settle,
    unblocked,
)

EPIC = """
name: greet
tasks:
  - {id: a, role: coder, prompt: write a, checks: ["test -f a"]}
  - {id: b, role: coder, prompt: write b, depends_on: [a]}
  - {id: c, role: coder, prompt: write c, max_attempts: 5}
"""


def test_epic_defaults_and_round_trip() -> None:
    spec = load(EPIC)
    assert spec.branch == "epic/greet"
    assert spec.max_waves == 50
    assert (spec.council.judges, spec.council.roles) == (2, ("judge",))
    assert [t.max_attempts for t in spec.tasks] == [3, 3, 5]
    assert spec.task("a").checks == ("test -f a",)
    assert parse(spec.to_data()) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\ntasks: [", "not valid YAML at line"),
        ("- 1", "epic: a mapping is required"),
        ("tasks: [{id: a, role: r, prompt: p}]", "name: a non-empty string is required"),
        ("name: x\ntasks: []", "tasks: a non-empty list"),
        ("name: x\nfoo: 1\ntasks: [{id: a, role: r, prompt: p}]", "foo: unknown key"),
        ("name: x\ntasks: [{id: a, role: r}]", "tasks[0].prompt: a non-empty string"),
        ("name: x\ntasks: [{id: A!, role: r, prompt: p}]", "tasks[0].id: 'A!' does not match"),
        ("name: x\ntasks: [{id: a, role: r, prompt: p, x: 1}]", "tasks[0].x: unknown key"),
        (
            "name: x\ntasks: [{id: a, role: r, prompt: p}, {id: a, role: r, prompt: p}]",
            "tasks[1].id: 'a' is also tasks[0]",
        ),
        (
            "name: x\ntasks: [{id: a, role: r, prompt: p, depends_on: [a, zz]}]",
            "tasks[0].depends_on[0]: a task cannot depend on itself",
        ),
        (
            "name: x\ntasks: [{id: a, role: r, prompt: p, depends_on: [zz]}]",
            "tasks[0].depends_on[0]: no task 'zz'",
        ),
        (
            "name: x\ntasks: [{id: a, role: r, prompt: p, depends_on: [b]},"
            " {id: b, role: r, prompt: p, depends_on: [a]}]",
            "cycle: a -> b -> a",
        ),
        (
            "name: x\ntasks: [{id: a, role: r, prompt: p, checks: pytest}]",
            "tasks[0].checks: a list",
        ),
        ("name: x\ntasks: [{id: a, role: r, prompt: p, checks: [1]}]", "tasks[0].checks[0]: a non"),
        ("name: x\ntasks: [{id: a, role: r, prompt: p, max_attempts: 6}]", "not within 1..5"),
        ("name: x\ntasks: [{id: a, role: r, prompt: p, max_attempts: yes}]", "an integer"),
        ("name: x\nmax_waves: 51\ntasks: [{id: a, role: r, prompt: p}]", "max_waves: 51 is not"),
        ("name: x\ncouncil: {judges: 7}\ntasks: [{id: a, role: r, prompt: p}]", "council.judges"),
        ("name: x\ncouncil: {roles: []}\ntasks: [{id: a, role: r, prompt: p}]", "council.roles"),
        ("name: x\nbranch: -x\ntasks: [{id: a, role: r, prompt: p}]", "branch: '-x' does not"),
    ],
)
def test_bad_epic_files_name_the_key(text: str, message: str) -> None:
    with pytest.raises(EpicFileError) as err:
        load(text)
    assert message in str(err.value)
    assert isinstance(err.value, InvalidRequest)  # every edge shows it as bad input


P, W, F = Verdict.PASS, Verdict.WARN, Verdict.FAIL


def v(verdict: Verdict, vendor: str = "claude-code", critical: bool = False) -> JudgeVerdict:
    return JudgeVerdict(verdict=verdict, vendor=vendor, critical=critical)


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([], Consensus.PASS),
        ([v(P), v(P)], Consensus.PASS),
        ([v(P), v(W)], Consensus.WARN),
        ([v(W), v(W)], Consensus.WARN),
        ([v(P), v(F)], Consensus.FAIL),
        ([v(W), v(F)], Consensus.FAIL),
        ([v(P, "claude-code"), v(F, "codex")], Consensus.DISAGREE),
        ([v(P, "claude-code"), v(W, "codex")], Consensus.WARN),
        ([v(P, "codex"), v(P, "claude-code")], Consensus.PASS),
        ([v(P), v(W, critical=True)], Consensus.FAIL),  # a critical finding forces FAIL
        ([v(P, "claude-code"), v(P, "codex", critical=True)], Consensus.DISAGREE),
    ],
)
def test_council(verdicts: list[JudgeVerdict], expected: Consensus) -> None:
    assert council(verdicts) is expected


@pytest.mark.parametrize(
    ("checks", "consensus", "expected"),
    [
        (True, Consensus.PASS, Gate.PASS),
        (True, Consensus.WARN, Gate.PASS),
        (True, None, Gate.PASS),
        (True, Consensus.FAIL, Gate.FAIL),
        (True, Consensus.DISAGREE, Gate.ESCALATE),
        (False, Consensus.PASS, Gate.FAIL),  # mechanical checks override a council PASS
        (False, None, Gate.FAIL),
    ],
)
def test_gate(checks: bool, consensus: Consensus | None, expected: Gate) -> None:
    assert gate(checks, consensus) is expected


@pytest.mark.parametrize(
    ("attempts", "failures", "bound", "state", "after"),
    [
        (1, 0, 3, TaskState.OPEN, 1),
        (2, 1, 3, TaskState.OPEN, 2),
        (3, 2, 3, TaskState.STRUCK, 3),  # third consecutive failure: struck
        (1, 0, 1, TaskState.STRUCK, 1),  # bound of one try spent
        (2, 0, 2, TaskState.STRUCK, 1),
        (4, 2, 5, TaskState.STRUCK, 3),  # the strike rule beats a larger bound
        (3, 1, 5, TaskState.OPEN, 2),
    ],
)
def test_after_failure(
    attempts: int, failures: int, bound: int, state: TaskState, after: int
) -> None:
    out = after_failure(attempts=attempts, failures=failures, max_attempts=bound)
    assert (out.state, out.failures) == (state, after)


@pytest.mark.parametrize(
    ("current", "new", "ok"),
    [
        (TaskState.OPEN, TaskState.RUNNING, True),
        (TaskState.RUNNING, TaskState.PASSED, True),
        (TaskState.RUNNING, TaskState.OPEN, True),
        (TaskState.PASSED, TaskState.PASSED, True),
        (TaskState.PASSED, TaskState.OPEN, False),  # the ratchet
        (TaskState.PASSED, TaskState.RUNNING, False),
        (TaskState.STRUCK, TaskState.OPEN, False),
        (TaskState.ESCALATED, TaskState.PASSED, True),  # a human approved
        (TaskState.ESCALATED, TaskState.STRUCK, True),  # or denied
        (TaskState.ESCALATED, TaskState.OPEN, False),
    ],
)
def test_settle_is_a_ratchet(current: TaskState, new: TaskState, ok: bool) -> None:
    if ok:
        assert settle(current, new) is new
    else:
        with pytest.raises(InvalidRequest):
            settle(current, new)


OP, R, PA, S = TaskState.OPEN, TaskState.RUNNING, TaskState.PASSED, TaskState.STRUCK


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"a": OP, "b": OP, "c": OP}, ["a", "c"]),
        ({"a": PA, "b": OP, "c": OP}, ["b", "c"]),
        ({"a": R, "b": OP, "c": PA}, []),
        ({"a": S, "b": OP, "c": PA}, []),
    ],
)
def test_unblocked(states: dict[str, TaskState], expected: list[str]) -> None:
    assert unblocked(load(EPIC), states) == expected


def test_an_escalated_dependency_blocks_nothing_until_decided() -> None:
    spec = load(EPIC)
    states = {"a": TaskState.ESCALATED, "b": OP, "c": OP}
    assert block_all(spec, states) == states
    assert unblocked(spec, states) == ["c"]


def test_a_struck_dependency_blocks_transitively() -> None:
    spec = parse(
        {
            "name": "x",
            "tasks": [
                {"id": "a", "role": "r", "prompt": "p"},
                {"id": "b", "role": "r", "prompt": "p", "depends_on": ["a"]},
                {"id": "c", "role": "r", "prompt": "p", "depends_on": ["b"]},
            ],
        }
    )
    assert block_all(spec, {"a": S, "b": OP, "c": OP}) == {
        "a": S,
        "b": TaskState.BLOCKED,
        "c": TaskState.BLOCKED,
    }


@pytest.mark.parametrize(
    ("states", "waves", "expected"),
    [
        ({"a": PA, "b": PA, "c": PA}, 2, EpicState.DONE),
        ({"a": PA, "b": PA, "c": S}, 3, EpicState.PARTIAL),
        ({"a": PA, "b": OP, "c": OP}, 1, None),
        ({"a": PA, "b": OP, "c": OP}, 50, EpicState.WAVE_LIMIT),
        ({"a": PA, "b": PA, "c": PA}, 50, EpicState.DONE),
        ({"a": PA, "b": OP, "c": TaskState.ESCALATED}, 2, None),  # waits for the human
        ({"a": TaskState.ESCALATED, "b": OP, "c": PA}, 2, None),
        ({"a": S, "b": TaskState.BLOCKED, "c": TaskState.ESCALATED}, 3, None),
    ],
)
def test_epic_end(states: dict[str, TaskState], waves: int, expected: EpicState | None) -> None:
    assert epic_end(load(EPIC), states, waves) is expected


def test_read_verdict() -> None:
    got = read_verdict(
        {"verdict": "pass", "confidence": "HIGH", "findings": [{"severity": "critical"}]}, "codex"
    )
    assert (got.verdict, got.critical, got.vendor) == (Verdict.PASS, True, "codex")
    for bad, message in (
        ([], "a JSON object"),
        ({"verdict": "maybe"}, "verdict: one of"),
        ({"verdict": "PASS", "confidence": "x"}, "confidence: one of"),
        ({"verdict": "PASS", "findings": {}}, "findings: a list"),
    ):
        with pytest.raises(VerdictError, match=message):
            read_verdict(bad, "codex")
