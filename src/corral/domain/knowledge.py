"""The knowledge flywheel's records: learnings extracted from finished runs, the history of their
scores, the citations that say which attempt was given which learning, and the runs of each
A/B arm. The formulas over them are the knowledge room's (corral/knowledge); the store keeps
them (migration 0023)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class LearningKind(StrEnum):
    """The seed's knowledge types (the AgentOps design)."""

    SOLUTION = "solution"
    DECISION = "decision"
    FAILURE = "failure"
    LEARNING = "learning"
    REFERENCE = "reference"


class Tier(StrEnum):
    GOLD = "gold"
    SILVER = "silver"
    BRONZE = "bronze"
    DISCARD = "discard"


class Maturity(StrEnum):
    """The maturity state machine (docs/explanation/knowledge.md)."""

    PROVISIONAL = "provisional"
    CANDIDATE = "candidate"
    ESTABLISHED = "established"
    ANTI_PATTERN = "anti-pattern"


class LearningStatus(StrEnum):
    """`pending`: a bronze learning waiting for a human (`corral knowledge promote`); only
    `active` ones are injected; `retired` is final."""

    ACTIVE = "active"
    PENDING = "pending"
    RETIRED = "retired"


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """Where a learning comes from: the job, its attempt and the commit its workspace was at."""

    job_id: str | None = None
    attempt: int | None = None
    commit: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """What an extractor proposes, before scoring."""

    kind: LearningKind
    title: str
    body: str
    confidence: str = "medium"  # declared: high | medium | low (anything else counts 0.6)


@dataclass(frozen=True, slots=True, kw_only=True)
class Learning:
    id: str
    tenant: str
    role: str
    kind: LearningKind
    title: str
    body: str
    digest: str  # of the normalised kind, title and body: one learning per content and scope
    score: float  # the rubric's raw score at ingest
    tier: Tier
    confidence: float  # the tier's confidence, then the evidence confidence after feedback
    utility: float
    maturity: Maturity
    status: LearningStatus
    provenance: Provenance
    created_at: float
    updated_at: float
    reward_count: int = 0
    helpful_count: int = 0
    harmful_count: int = 0
    last_reward_at: float | None = None
    citations: int = 0  # how many attempts were given it

    def with_(self, **changes: Any) -> Learning:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningChange:
    """One line of a learning's append-only history: what changed, why and by whom."""

    learning_id: str
    at: float
    action: str  # created | rewarded | promoted | retired | maturity
    actor: str
    reason: str = ""
    job_id: str | None = None
    utility_before: float | None = None
    utility_after: float | None = None
    confidence_before: float | None = None
    confidence_after: float | None = None
    maturity_before: str | None = None
    maturity_after: str | None = None
    status_before: str | None = None
    status_after: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Citation:
    """A learning given to an attempt (injected into its appended system prompt); `reward`
    once that run ended and moved the learning's utility."""

    learning_id: str
    job_id: str
    attempt: int
    at: float
    rank: int  # 1 = first in the injected block
    score: float  # its ranking score then
    reward: float | None = None


class Arm(StrEnum):
    """Whether a run was given learnings (the flywheel's A/B measure)."""

    WITH = "with"
    WITHOUT = "without"


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeRun:
    """One agent attempt's arm, then how its run ended (for `corral knowledge stats`)."""

    job_id: str
    attempt: int
    tenant: str
    role: str
    arm: Arm
    reason: str  # why that arm: injected | off | control | none_found
    injected: int
    started_at: float
    succeeded: bool | None = None
    tool_calls: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmStats:
    """Per role and arm: how many runs ended, how many succeeded, their tool calls."""

    role: str
    arm: Arm
    runs: int
    succeeded: int
    tool_calls: int

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.runs if self.runs else None

    @property
    def tool_calls_per_run(self) -> float | None:
        return self.tool_calls / self.runs if self.runs else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningUpdate:
    """A learning's new numbers (or status) with the history line that says why; `before` is
    what the writer read: the store refuses the update (StaleState) when the learning changed
    since, so two engines rewarding it at once both count."""

    before: Learning
    after: Learning
    change: LearningChange
