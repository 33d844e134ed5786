"""The JSON shapes of the knowledge flywheel (`corral knowledge … --json`): a learning with its
scores decayed to now, its detail (history of score changes, the attempts it was given to) and
the A/B statistics per role (services/knowledge.py). Times are epoch seconds, as the store keeps
them."""

from __future__ import annotations

from pydantic import Field

from corral.domain import knowledge as dk

from .views import View

Pair = tuple[float | None, float | None]
TextPair = tuple[str | None, str | None]


class Provenance(View):
    """Where a learning came from: the run that taught it."""

    job_id: str | None
    attempt: int | None
    commit: str | None


class Learning(View):
    """`knowledge list|search|promote|retire`: a learning, its confidence and freshness decayed
    to now."""

    id: str
    tenant: str
    role: str
    kind: dk.LearningKind
    title: str
    body: str
    score: float = Field(description="The rubric's raw score at ingest.")
    tier: dk.Tier
    status: dk.LearningStatus = Field(
        description="active: given to runs; pending: waits for a human; retired: final."
    )
    maturity: dk.Maturity
    utility: float
    confidence: float = Field(description="As stored (at its last change).")
    confidence_now: float = Field(description="Decayed to now.")
    freshness: float = Field(description="Decayed to now.")
    rewards: int = Field(description="Rewards from the runs it was given to.")
    helpful: int
    harmful: int
    citations: int = Field(description="How many attempts were given it.")
    provenance: Provenance
    created_at: float = Field(description="Epoch seconds.")
    updated_at: float = Field(description="Epoch seconds.")
    last_reward_at: float | None = Field(description="Epoch seconds.")


class LearningPage(View):
    """`GET /api/v1/knowledge`: the token's tenant's learnings, best match or newest first."""

    learnings: list[Learning]


class LearningChange(View):
    """One line of a learning's history: each pair is [before, after] (null: unchanged)."""

    seq: int | None
    at: float = Field(description="Epoch seconds.")
    action: str = Field(description="created, rewarded, promoted, retired or maturity.")
    actor: str
    reason: str
    job_id: str | None = Field(description="The run whose reward moved it.")
    utility: Pair
    confidence: Pair
    maturity: TextPair
    status: TextPair


class LearningCitation(View):
    """An attempt that was given the learning, at which rank, and the reward its run earned."""

    learning_id: str
    job_id: str
    attempt: int
    at: float = Field(description="Epoch seconds.")
    rank: int = Field(description="1: first in the injected block.")
    score: float = Field(description="Its ranking score then.")
    reward: float | None = Field(description="null until the run ended.")


class LearningShow(Learning):
    """`knowledge show`: the learning, its history (oldest first) and the attempts given it."""

    history: list[LearningChange]
    cited_by: list[LearningCitation]


class ArmRuns(View):
    """A role's finished runs in one arm of the A/B measure."""

    role: str
    arm: dk.Arm
    runs: int
    succeeded: int
    success_rate: float | None
    tool_calls: int
    tool_calls_per_run: float | None


class Uplift(View):
    """The `with` arm minus the `without` arm."""

    success_rate: float
    tool_calls_per_run: float


class RoleStats(View):
    """A role's runs with and without learnings (null: no run in that arm)."""

    role: str
    with_: ArmRuns | None = Field(alias="with")
    without: ArmRuns | None
    uplift: Uplift | None = Field(description="null unless both arms have runs.")


class LearningCounts(View):
    active: int
    pending: int
    retired: int


class KnowledgeStats(View):
    """`knowledge stats`: per role, whether giving learnings pays; the learnings by status."""

    roles: list[RoleStats]
    learnings: LearningCounts
