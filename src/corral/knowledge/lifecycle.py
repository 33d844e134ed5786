"""How a learning's numbers move (the AgentOps design, the spec's resolutions):

- utility: an EMA `u' = (1−α)·u + α·r`, α annealed with the learning's reward count n:
  `α = max(α₀/10, 3·α₀·e^(−0.1·n))`, α₀ = 0.1 (0.30 at n=0, 0.18 at 5, 0.11 at 10, 0.01 from 34);
- the reward of a run that was given the learning: 0.8 when it succeeded, 0.2 when it failed,
  0.4 when it was abandoned (cancelled, killed); r ≥ 0.8 counts helpful, r ≤ 0.2 harmful;
- evidence confidence after n rewards: `1 − 1/(1 + n/5)`;
- confidence decays on read, 0.10 a week since the last reward (else since creation), floor 0.1;
- freshness decays 0.17 a week since creation, floor 0.1;
- maturity: provisional → candidate → established, any → anti-pattern, and back."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.domain.knowledge import Learning, LearningChange, Maturity

WEEK_S = 7 * 24 * 3600.0
ALPHA = 0.1
INITIAL_UTILITY = 0.5
CONFIDENCE_DECAY_PER_WEEK = 0.10
FRESHNESS_DECAY_PER_WEEK = 0.17
FLOOR = 0.1
HELPFUL = 0.8  # a reward at least this counts helpful
HARMFUL = 0.2  # at most this, harmful
REWARD_SUCCEEDED = 0.8
REWARD_FAILED = 0.2
REWARD_ABANDONED = 0.4
# Maturity thresholds
PROMOTE_UTILITY = 0.55
DEMOTE_UTILITY = 0.30
ESTABLISHED_FLOOR = 0.50
ANTI_PATTERN_UTILITY = 0.20
REHABILITATE_UTILITY = 0.60
MIN_FEEDBACK = 3
MIN_HARMFUL = 3


def weeks(seconds: float) -> float:
    return max(0.0, seconds) / WEEK_S


def annealed_alpha(reward_count: int, base: float = ALPHA) -> float:
    return max(base / 10, 3 * base * math.exp(-0.1 * reward_count))


def ema(utility: float | None, reward: float, alpha: float) -> float:
    """The new utility; an unknown one (None) starts at 0.5."""
    u = INITIAL_UTILITY if utility is None else utility
    return (1 - alpha) * u + alpha * reward


def evidence_confidence(reward_count: int) -> float:
    return 1 - 1 / (1 + reward_count / 5)


def decayed_confidence(confidence: float, age_weeks: float) -> float:
    return max(FLOOR, confidence * math.exp(-CONFIDENCE_DECAY_PER_WEEK * age_weeks))


def freshness(age_weeks: float) -> float:
    return max(FLOOR, math.exp(-FRESHNESS_DECAY_PER_WEEK * age_weeks))


def confidence_now(learning: Learning, now: float) -> float:
    """The learning's confidence decayed to `now` (a pure function of time: nothing rewritten)."""
    since = learning.last_reward_at if learning.last_reward_at is not None else learning.created_at
    return decayed_confidence(learning.confidence, weeks(now - since))


def freshness_now(learning: Learning, now: float) -> float:
    return freshness(weeks(now - learning.created_at))


def run_reward(state: str) -> float | None:
    """The reward of a run that was given learnings, by the job's final state; None for a run
    that says nothing of them (denied before it ran)."""
    if state == "SUCCEEDED":
        return REWARD_SUCCEEDED
    if state in ("FAILED", "TIMED_OUT", "DEAD_LETTERED"):
        return REWARD_FAILED
    if state in ("CANCELLED", "KILLED"):
        return REWARD_ABANDONED
    return None


def next_maturity(
    maturity: Maturity, utility: float, rewards: int, helpful: int, harmful: int
) -> Maturity:
    """The machine: the anti-pattern check first, then the state's own transitions."""
    if utility <= ANTI_PATTERN_UTILITY and harmful >= MIN_HARMFUL:
        return Maturity.ANTI_PATTERN
    if maturity is Maturity.PROVISIONAL:
        if utility >= PROMOTE_UTILITY and rewards >= MIN_FEEDBACK:
            return Maturity.CANDIDATE
    elif maturity is Maturity.CANDIDATE:
        if utility >= PROMOTE_UTILITY and rewards >= 5 and (helpful > harmful or rewards >= 10):
            return Maturity.ESTABLISHED
        if utility < DEMOTE_UTILITY:
            return Maturity.PROVISIONAL
    elif maturity is Maturity.ESTABLISHED:
        if utility < ESTABLISHED_FLOOR:
            return Maturity.CANDIDATE
    elif (
        maturity is Maturity.ANTI_PATTERN
        and utility >= REHABILITATE_UTILITY
        and helpful > 2 * harmful
    ):
        return Maturity.PROVISIONAL
    return maturity


@dataclass(frozen=True, slots=True)
class Feedback:
    learning: Learning  # after the reward
    change: LearningChange  # the history line that says so
    alpha: float


def reward(
    learning: Learning, r: float, *, now: float, job_id: str | None, actor: str, reason: str
) -> Feedback:
    """One reward: utility by the annealed EMA, the counters, the evidence confidence (reset,
    as the seed's code does) and the maturity transition it allows."""
    alpha = annealed_alpha(learning.reward_count)
    utility = ema(learning.utility, r, alpha)
    n = learning.reward_count + 1
    helpful = learning.helpful_count + (1 if r >= HELPFUL else 0)
    harmful = learning.harmful_count + (1 if r <= HARMFUL else 0)
    maturity = next_maturity(learning.maturity, utility, n, helpful, harmful)
    after = learning.with_(
        utility=utility,
        reward_count=n,
        helpful_count=helpful,
        harmful_count=harmful,
        confidence=evidence_confidence(n),
        maturity=maturity,
        last_reward_at=now,
        updated_at=now,
    )
    change = LearningChange(
        learning_id=learning.id,
        at=now,
        action="rewarded",
        actor=actor,
        reason=reason,
        job_id=job_id,
        utility_before=learning.utility,
        utility_after=utility,
        confidence_before=learning.confidence,
        confidence_after=after.confidence,
        maturity_before=learning.maturity.value,
        maturity_after=maturity.value,
    )
    return Feedback(learning=after, change=change, alpha=alpha)
