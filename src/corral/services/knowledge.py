"""The knowledge flywheel for operators (`corral knowledge …`): list, show, search the
learnings; promote a bronze one a human approved, retire one; and the A/B statistics that say
whether injecting learnings pays (runs with and without them, per role: success rate and tool
calls). Writing learnings from runs is the runtime's (runtime/flywheel.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.config import Config
from corral.core.ports import JobGovernance, KnowledgeStore
from corral.domain.errors import InvalidRequest, NotFound, StaleState
from corral.domain.knowledge import (
    ArmStats,
    Citation,
    Learning,
    LearningChange,
    LearningKind,
    LearningStatus,
    LearningUpdate,
    Tier,
)
from corral.domain.models import JobSpec
from corral.knowledge import lifecycle
from corral.schemas import knowledge as views
from corral.services import Wake

if TYPE_CHECKING:
    from corral.runtime.flywheel import Submit
    from corral.services.submissions import Submissions

MAX_REASON = 1000  # a promotion's note or a retirement's reason (the seed's gate limit)
STATUSES = ("active", "pending", "retired", "all")


def status_of(text: str) -> LearningStatus | None:
    """`all` → None; else the status, or InvalidRequest naming the choices."""
    if text == "all":
        return None
    try:
        return LearningStatus(text)
    except ValueError:
        raise InvalidRequest(f"unknown status {text!r}: one of {', '.join(STATUSES)}") from None


def learning_view(x: Learning, now: float) -> dict[str, Any]:
    """A learning for people and scripts, with its confidence and freshness decayed to now
    (the published `Learning` shape)."""
    return views.Learning.model_validate(_learning(x, now)).dump()


def _learning(x: Learning, now: float) -> dict[str, Any]:
    return {
        "id": x.id,
        "tenant": x.tenant,
        "role": x.role,
        "kind": x.kind.value,
        "title": x.title,
        "body": x.body,
        "score": round(x.score, 4),
        "tier": x.tier.value,
        "status": x.status.value,
        "maturity": x.maturity.value,
        "utility": round(x.utility, 4),
        "confidence": round(x.confidence, 4),
        "confidence_now": round(lifecycle.confidence_now(x, now), 4),
        "freshness": round(lifecycle.freshness_now(x, now), 4),
        "rewards": x.reward_count,
        "helpful": x.helpful_count,
        "harmful": x.harmful_count,
        "citations": x.citations,
        "provenance": {
            "job_id": x.provenance.job_id,
            "attempt": x.provenance.attempt,
            "commit": x.provenance.commit,
        },
        "created_at": x.created_at,
        "updated_at": x.updated_at,
        "last_reward_at": x.last_reward_at,
    }


def change_view(c: LearningChange) -> dict[str, Any]:
    return {
        "seq": c.seq,
        "at": c.at,
        "action": c.action,
        "actor": c.actor,
        "reason": c.reason,
        "job_id": c.job_id,
        "utility": [c.utility_before, c.utility_after],
        "confidence": [c.confidence_before, c.confidence_after],
        "maturity": [c.maturity_before, c.maturity_after],
        "status": [c.status_before, c.status_after],
    }


def citation_view(c: Citation) -> dict[str, Any]:
    return {
        "learning_id": c.learning_id,
        "job_id": c.job_id,
        "attempt": c.attempt,
        "at": c.at,
        "rank": c.rank,
        "score": round(c.score, 4),
        "reward": c.reward,
    }


@dataclass(frozen=True, slots=True)
class Shown:
    learning: Learning
    history: list[LearningChange]
    citations: list[Citation]

    def view(self, now: float) -> dict[str, Any]:
        """The published `LearningShow` shape."""
        return views.LearningShow.model_validate(
            {
                **_learning(self.learning, now),
                "history": [change_view(c) for c in self.history],
                "cited_by": [citation_view(c) for c in self.citations],
            }
        ).dump()


async def learning_of(store: KnowledgeStore, ref: str, tenant: str) -> Learning:
    """The learning whose whole id is `ref`, when it is `tenant`'s; NotFound otherwise (another
    tenant's learning is not found, never refused: its existence is not said)."""
    try:
        x = await store.get_learning(ref)
    except (NotFound, InvalidRequest):  # a short or ambiguous reference: no whole id either
        raise NotFound(f"no learning {ref}") from None
    if x.id != ref or x.tenant != tenant:
        raise NotFound(f"no learning {ref}")
    return x


async def find(
    store: KnowledgeStore,
    *,
    tenant: str,
    query: str | None = None,
    role: str | None = None,
    kind: LearningKind | None = None,
    tier: Tier | None = None,
    status: LearningStatus | None = None,
    limit: int = 50,
    ref: str | None = None,
) -> list[Learning]:
    """A tenant's learnings: those the full-text search finds for `query` (best match first),
    else the newest; with `ref`, only those it names (no search then)."""
    if ref is None and query is not None and query.strip():
        return await store.search_learnings(
            query, tenant=tenant, role=role, status=status, limit=limit, kind=kind, tier=tier
        )
    return await store.list_learnings(
        tenant=tenant, role=role, status=status, limit=limit, kind=kind, tier=tier, ref=ref
    )


async def show(store: KnowledgeStore, ref: str, tenant: str | None = None) -> Shown:
    """A learning with its history and citations (`tenant`: only that tenant's, by whole id)."""
    x = await store.get_learning(ref) if tenant is None else await learning_of(store, ref, tenant)
    return Shown(
        learning=x,
        history=await store.learning_history(x.id),
        citations=await store.citations(learning_id=x.id),
    )


async def _change(
    store: KnowledgeStore,
    ref: str,
    *,
    to: LearningStatus,
    allowed: Sequence[LearningStatus],
    action: str,
    by: str,
    reason: str,
    now: float | None,
) -> Learning:
    if len(reason) > MAX_REASON:
        raise InvalidRequest(f"the reason is {len(reason)} characters: at most {MAX_REASON}")
    for _ in range(3):
        before = await store.get_learning(ref)
        if before.status not in allowed:
            raise InvalidRequest(
                f"learning {before.id} is {before.status.value}: only a learning that is "
                f"{' or '.join(s.value for s in allowed)} can be {action}"
            )
        at = time.time() if now is None else now
        after = before.with_(status=to, updated_at=max(at, before.updated_at + 1e-6))
        change = LearningChange(
            learning_id=before.id,
            at=at,
            action=action,
            actor=by,
            reason=reason,
            status_before=before.status.value,
            status_after=to.value,
            utility_before=before.utility,
            utility_after=before.utility,
        )
        try:
            await store.update_learnings(
                [LearningUpdate(before=before, after=after, change=change)]
            )
        except StaleState:
            continue  # a run rewarded it meanwhile: read it again
        return after
    raise StaleState(f"learning {ref} kept changing: try again")


async def promote(
    store: KnowledgeStore, ref: str, *, by: str, note: str = "", now: float | None = None
) -> Learning:
    """A human's approval: a pending (bronze) learning becomes active, so runs are given it."""
    return await _change(
        store,
        ref,
        to=LearningStatus.ACTIVE,
        allowed=(LearningStatus.PENDING,),
        action="promoted",
        by=by,
        reason=note,
        now=now,
    )


async def retire(
    store: KnowledgeStore, ref: str, *, by: str, reason: str, now: float | None = None
) -> Learning:
    """No run is given it any more (kept, with its history: retiring is final)."""
    if not reason.strip():
        raise InvalidRequest("say why the learning is retired (--reason)")
    return await _change(
        store,
        ref,
        to=LearningStatus.RETIRED,
        allowed=(LearningStatus.ACTIVE, LearningStatus.PENDING),
        action="retired",
        by=by,
        reason=reason,
        now=now,
    )


def arm_view(s: ArmStats) -> dict[str, Any]:
    return {
        "role": s.role,
        "arm": s.arm.value,
        "runs": s.runs,
        "succeeded": s.succeeded,
        "success_rate": None if s.success_rate is None else round(s.success_rate, 4),
        "tool_calls": s.tool_calls,
        "tool_calls_per_run": (
            None if s.tool_calls_per_run is None else round(s.tool_calls_per_run, 2)
        ),
    }


async def stats(
    store: KnowledgeStore, *, tenant: str | None = None, role: str | None = None
) -> dict[str, Any]:
    """Per role: the runs with and without injected learnings (and the difference in success
    rate and tool calls per run when both arms have runs), and the learnings by status (the
    published `KnowledgeStats` shape)."""
    arms = await store.knowledge_stats(tenant=tenant, role=role)
    roles: dict[str, dict[str, Any]] = {}
    for s in arms:
        entry = roles.setdefault(s.role, {"role": s.role, "with": None, "without": None})
        entry[s.arm.value] = arm_view(s)
    for entry in roles.values():
        w, wo = entry["with"], entry["without"]
        entry["uplift"] = (
            {
                "success_rate": round(w["success_rate"] - wo["success_rate"], 4),
                "tool_calls_per_run": round(w["tool_calls_per_run"] - wo["tool_calls_per_run"], 2),
            }
            if w and wo
            else None
        )
    counts: dict[str, int] = {s.value: 0 for s in LearningStatus}
    for (_, status), n in (await store.learning_counts(tenant=tenant, role=role)).items():
        counts[status] = counts.get(status, 0) + n
    shown = {"roles": [roles[r] for r in sorted(roles)], "learnings": counts}
    return views.KnowledgeStats.model_validate(shown).dump()  # the published shape


def extractor_jobs(store: JobGovernance, config: Config, wake: Wake) -> Submit:
    """How the engine's flywheel submits an agent extractor's job (`knowledge.extractor:
    agent:ROLE`): through the submission service every edge uses, so the job is validated,
    policed at submit and queued like any other; then the engine is woken to run it."""
    from corral.services.submissions import submissions  # the engine's: `knowledge` CLI needs none

    svc: list[Submissions] = []

    async def submit(spec: JobSpec) -> str:
        if not svc:
            svc.append(submissions(store, config))
        result = await svc[0].submit(spec)
        wake("submitted")
        return result.job.id

    return submit
