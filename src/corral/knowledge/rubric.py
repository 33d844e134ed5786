"""The 5-dimension rubric and its tiers: each dimension a heuristic in [0, 1], the
raw score `(base(kind) + Σ wᵢ·dimᵢ) / 2` plus 0.15 for a declared high confidence or 0.07 for
medium, clamped to [0, 1]; tiers are half-open intervals (the spec's resolutions)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from corral.domain.knowledge import Candidate, LearningKind, Tier

WEIGHTS = {
    "specificity": 0.30,
    "actionability": 0.25,
    "novelty": 0.20,
    "context": 0.15,
    "confidence": 0.10,
}
BASE_SCORE = {
    LearningKind.SOLUTION: 0.9,
    LearningKind.DECISION: 0.8,
    LearningKind.FAILURE: 0.75,
    LearningKind.LEARNING: 0.7,
    LearningKind.REFERENCE: 0.5,
}
DECLARED_CONFIDENCE = {"high": 0.9, "medium": 0.7, "low": 0.5}
DECLARED_BONUS = {"high": 0.15, "medium": 0.07}
# (tier, lower bound): evaluated gold → discard, each [min, next min)
TIERS = ((Tier.GOLD, 0.85), (Tier.SILVER, 0.70), (Tier.BRONZE, 0.50), (Tier.DISCARD, 0.0))
TIER_CONFIDENCE = {Tier.GOLD: 0.95, Tier.SILVER: 0.80, Tier.BRONZE: 0.60, Tier.DISCARD: 0.0}

_FILE = re.compile(r"\b[\w./-]+\.(?:go|ts|js|py|sh|yaml|yml|json|md)\b")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+\.)\s", re.MULTILINE)
_IMPERATIVE = re.compile(
    r"\b(?:run|add|remove|use|ensure|check|grep|rg|fix|avoid|prefer|must|should)\b", re.I
)
_SOURCE = re.compile(r"## source|\*\*source\*\*", re.I)
_WHY = re.compile(r"## why it matters", re.I)


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def specificity(body: str) -> float:
    s = 0.4
    s += 0.2 if "`" in body else 0.0
    s += 0.2 if any(c.isdigit() for c in body) else 0.0
    s += 0.2 if _FILE.search(body) else 0.0
    s += 0.1 if "line " in body else 0.0
    return _clamp(s)


def actionability(body: str) -> float:
    s = 0.4
    s += 0.2 if _BULLET.search(body) else 0.0
    s += 0.2 if _IMPERATIVE.search(body) else 0.0
    s += 0.2 if "```" in body else 0.0
    return _clamp(s)


def novelty(body: str) -> float:
    s = 0.5
    if len(body) > 800:
        s += 0.1
    elif len(body) < 250:
        s -= 0.1
    return _clamp(s)


def context(body: str) -> float:
    s = 0.5
    s += 0.2 if _SOURCE.search(body) else 0.0
    s += 0.1 if _WHY.search(body) else 0.0
    return _clamp(s)


def declared_confidence(declared: str) -> float:
    return DECLARED_CONFIDENCE.get(declared.lower(), 0.6)


@dataclass(frozen=True, slots=True)
class Score:
    dimensions: dict[str, float]
    raw: float
    tier: Tier

    @property
    def confidence(self) -> float:
        """The stored confidence of a new learning of this tier."""
        return TIER_CONFIDENCE[self.tier]

    @property
    def needs_human(self) -> bool:
        """Bronze is always gated by a human (seed: ingest sets gate_required on every bronze)."""
        return self.tier is Tier.BRONZE


def tier_of(raw: float) -> Tier:
    for tier, low in TIERS:
        if raw >= low:
            return tier
    return Tier.DISCARD


def score(c: Candidate) -> Score:
    dims = {
        "specificity": specificity(c.body),
        "actionability": actionability(c.body),
        "novelty": novelty(c.body),
        "context": context(c.body),
        "confidence": declared_confidence(c.confidence),
    }
    weighted = sum(WEIGHTS[k] * v for k, v in dims.items())
    raw = (BASE_SCORE[c.kind] + weighted) / 2 + DECLARED_BONUS.get(c.confidence.lower(), 0.0)
    raw = _clamp(raw)
    return Score(dimensions=dims, raw=raw, tier=tier_of(raw))


def digest(kind: LearningKind, title: str, body: str) -> str:
    """One learning per content: sha256 of the kind, title and body, case and spacing folded."""
    norm = " ".join(f"{kind.value}\n{title}\n{body}".lower().split())
    return hashlib.sha256(norm.encode()).hexdigest()
