"""The ratchet's pure rules (docs/how-to/epics.md): which tasks a
wave takes, what a council of verdicts comes to, whether a task's try passes its gate, what a
failure leads to, and when an epic ends. No I/O: services/epics.py persists and acts.

- Find: the open tasks whose dependencies all passed, in the epic file's order.
- Council: all PASS → PASS; any FAIL → FAIL; else WARN; a PASS and a FAIL from different
  vendors → DISAGREE (a human decides); a critical finding makes its verdict a FAIL.
- Gate: the checks override a council PASS; the try passes when the checks pass and the
  council neither FAILs nor DISAGREEs (WARN passes).
- Escalate: a failed try is retried within its bound (max_attempts, the first try included);
  the bound spent, or 3 consecutive failures (the strike rule), strikes the task — unless
  its `on_exhausted` steps escalate it first: re-decomposed (an agent job proposes smaller
  tasks that replace it: DECOMPOSED) or handed to a human. DISAGREE escalates it to a human
  (an approval: approved, its work is committed; denied, struck), and the epic waits for
  that decision before it ends.
- Ratchet: a passed task never reopens (`settle` refuses it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from corral.domain.epics import EpicState, TaskState
from corral.domain.errors import InvalidRequest
from corral.waves.epic import EpicSpec

STRIKES = 3  # consecutive failures that skip a task (the strike rule)


class Verdict(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


class Consensus(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    DISAGREE = "DISAGREE"


class Confidence(StrEnum):
    HIGH = "HIGH"
    MEDIUM = "MEDIUM"
    LOW = "LOW"


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgeVerdict:
    """What one judge's verdict file says (only this travels to the lead)."""

    verdict: Verdict
    confidence: Confidence = Confidence.MEDIUM
    vendor: str = ""  # the judge's worker kind: who made the model
    critical: bool = False  # a finding of severity critical
    key_insight: str = ""

    def to_data(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "confidence": self.confidence.value,
            "vendor": self.vendor,
            "critical": self.critical,
            "key_insight": self.key_insight,
        }


class VerdictError(InvalidRequest):
    """A judge's verdict file does not hold a verdict."""


def read_verdict(data: object, vendor: str) -> JudgeVerdict:
    """A judge's verdict file's JSON (`verdict`, `confidence`, optional `findings[].severity`,
    `key_insight`), validated."""
    if not isinstance(data, dict):
        raise VerdictError("a verdict file holds a JSON object")
    try:
        verdict = Verdict(str(data.get("verdict", "")).upper())
    except ValueError:
        raise VerdictError("verdict: one of PASS, WARN, FAIL is required") from None
    try:
        confidence = Confidence(str(data.get("confidence", "MEDIUM")).upper())
    except ValueError:
        raise VerdictError("confidence: one of HIGH, MEDIUM, LOW is required") from None
    findings = data.get("findings", [])
    if not isinstance(findings, list):
        raise VerdictError("findings: a list is required")
    critical = any(isinstance(f, dict) and f.get("severity") == "critical" for f in findings)
    insight = data.get("key_insight", "")
    return JudgeVerdict(
        verdict=verdict,
        confidence=confidence,
        vendor=vendor,
        critical=critical,
        key_insight=insight[:500] if isinstance(insight, str) else "",
    )


def council(verdicts: Sequence[JudgeVerdict]) -> Consensus:
    """The council's consensus; no judges (council.judges 0) is a PASS."""
    seen = [Verdict.FAIL if v.critical else v.verdict for v in verdicts]
    passing = {v.vendor for v, s in zip(verdicts, seen, strict=True) if s is Verdict.PASS}
    failing = {v.vendor for v, s in zip(verdicts, seen, strict=True) if s is Verdict.FAIL}
    if any(a != b for a in passing for b in failing):
        return Consensus.DISAGREE
    if failing:
        return Consensus.FAIL
    if all(s is Verdict.PASS for s in seen):
        return Consensus.PASS
    return Consensus.WARN


class Gate(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ESCALATE = "escalate"


def gate(checks_passed: bool, consensus: Consensus | None) -> Gate:
    """A try's gate: mechanical checks first (they override a council PASS); `consensus` None
    when the council did not sit (the checks failed)."""
    if not checks_passed or consensus is Consensus.FAIL:
        return Gate.FAIL
    if consensus is Consensus.DISAGREE:
        return Gate.ESCALATE
    return Gate.PASS


@dataclass(frozen=True, slots=True, kw_only=True)
class AfterFailure:
    state: TaskState  # OPEN: retried next wave; STRUCK
    failures: int
    reason: str


def after_failure(*, attempts: int, failures: int, max_attempts: int) -> AfterFailure:
    """What a failed try leads to: `attempts` tries made (this one included), `failures` the
    consecutive failures before this one."""
    failures += 1
    if failures >= STRIKES:
        return AfterFailure(
            state=TaskState.STRUCK, failures=failures, reason=f"{failures} consecutive failures"
        )
    if attempts >= max_attempts:
        return AfterFailure(
            state=TaskState.STRUCK, failures=failures, reason=f"{attempts} of {max_attempts} tries"
        )
    return AfterFailure(state=TaskState.OPEN, failures=failures, reason="retried")


def settle(current: TaskState, new: TaskState) -> TaskState:
    """The ratchet: a passed task never changes again; a settled one never reopens (an
    escalated one is settled by its human: passed or struck)."""
    if current is TaskState.PASSED and new is not TaskState.PASSED:
        raise InvalidRequest("a passed task never reopens (the ratchet)")
    decided = (TaskState.PASSED, TaskState.STRUCK, TaskState.DECOMPOSED)
    human = current is TaskState.ESCALATED and new in decided
    if current.settled and current is not new and not human:
        raise InvalidRequest(f"a {current.value} task cannot become {new.value}")
    return new


def unblocked(spec: EpicSpec, states: Mapping[str, TaskState]) -> list[str]:
    """Find: the open tasks whose dependencies all passed, in the epic's order."""
    return [
        t.id
        for t in spec.tasks
        if states[t.id] is TaskState.OPEN
        and all(states[d] is TaskState.PASSED for d in t.depends_on)
    ]


def blocked(spec: EpicSpec, states: Mapping[str, TaskState]) -> list[str]:
    """Open tasks that can never run: a dependency ended without passing (transitively, as the
    caller applies this until nothing changes)."""
    # an escalated task waits for a human or its re-decomposition (which rewires its dependents)
    alive = (TaskState.PASSED, TaskState.ESCALATED, TaskState.DECOMPOSED)
    dead = {s for s, st in states.items() if st.settled and st not in alive}
    return [
        t.id
        for t in spec.tasks
        if states[t.id] is TaskState.OPEN and any(d in dead for d in t.depends_on)
    ]


def block_all(spec: EpicSpec, states: Mapping[str, TaskState]) -> dict[str, TaskState]:
    """`states` with every task behind a dead dependency BLOCKED, transitively."""
    out = dict(states)
    while more := blocked(spec, out):
        out.update(dict.fromkeys(more, TaskState.BLOCKED))
    return out


def epic_end(
    spec: EpicSpec, states: Mapping[str, TaskState], waves_started: int
) -> EpicState | None:
    """The epic's end state once nothing is left to run or the wave limit is reached, else None
    (call with every wave reaped)."""
    if all(s in (TaskState.PASSED, TaskState.DECOMPOSED) for s in states.values()):
        return EpicState.DONE  # a decomposed task is done when the tasks replacing it are
    if not unblocked(spec, states):
        # a task escalated to a human holds the epic open until the human decides
        waiting = any(s is TaskState.ESCALATED for s in states.values())
        return None if waiting else EpicState.PARTIAL
    if waves_started >= spec.max_waves:
        return EpicState.WAVE_LIMIT
    return None
