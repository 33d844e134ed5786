"""The dashboard's knowledge pages (ui/knowledge.py): the viewer's tenant's learnings only,
searched and filtered, with the per-role A/B statistics; one learning's text, provenance, score
history and citations; everything an agent wrote (title, body, a history line's reason) is
escaped, and another tenant's learning is not found."""

from __future__ import annotations

from pathlib import Path

from corral.domain.knowledge import (
    Arm,
    Citation,
    KnowledgeRun,
    LearningChange,
    LearningKind,
    LearningStatus,
    LearningUpdate,
    Tier,
)
from tests.contract.test_knowledge_contract import created, make
from tests.unit.test_api_jobs import config
from tests.unit.test_ui import PLANT, Ui, elements, with_ui


async def seed(u: Ui) -> None:
    planted = make("lrn-acme-planted", f"Cache {PLANT}", f"Body {PLANT}", tenant="acme")
    other = make(
        "lrn-acme-pending",
        "Pin the seed",
        "Use random.seed(0) in tests",
        tenant="acme",
        role="ops",
        status=LearningStatus.PENDING,
        at=1_700_000_001.0,
    ).with_(kind=LearningKind.FAILURE, tier=Tier.BRONZE)
    theirs = make("lrn-globex-1", "Globex secret", "Globex only", tenant="globex")
    for x in (planted, other, theirs):
        assert await u.store.add_learning(x, created(x))
    run = KnowledgeRun(
        job_id="job-2",
        attempt=1,
        tenant="acme",
        role="coder",
        arm=Arm.WITH,
        reason="injected",
        injected=1,
        started_at=2.0,
    )
    cite = Citation(learning_id=planted.id, job_id="job-2", attempt=1, at=2.0, rank=1, score=1.5)
    await u.store.record_injection(run, [cite])
    after = planted.with_(utility=0.59, reward_count=1, updated_at=3.0)
    change = LearningChange(
        learning_id=planted.id,
        at=3.0,
        action="rewarded",
        actor="corral",
        reason=PLANT,
        job_id="job-2",
        utility_before=0.5,
        utility_after=0.59,
    )
    await u.store.settle_run(
        "job-2",
        succeeded=True,
        tool_calls=4,
        reward=0.8,
        updates=[LearningUpdate(before=planted, after=after, change=change)],
    )


def test_knowledge_pages_show_the_tenants_learnings_with_everything_escaped(
    tmp_path: Path,
) -> None:
    async def body(u: Ui) -> None:
        await seed(u)
        await u.login("reader")
        listing = await u.client.get("/ui/knowledge")
        assert listing.status_code == 200, listing.text
        assert 'href="/ui/knowledge"' in listing.text  # in the navigation
        assert "lrn-acme-planted" in listing.text and "lrn-acme-pending" in listing.text
        assert "Globex" not in listing.text
        assert "with learnings" in listing.text and "100.0 %" in listing.text  # the A/B table
        assert "1 active, 1 pending (a human's), 0 retired" in listing.text
        for query, shown, hidden in (
            ("q=seed", "lrn-acme-pending", "lrn-acme-planted"),
            ("type=failure", "lrn-acme-pending", "lrn-acme-planted"),
            ("tier=gold&status=active", "lrn-acme-planted", "lrn-acme-pending"),
            ("role=ops", "lrn-acme-pending", "lrn-acme-planted"),
        ):
            r = await u.client.get(f"/ui/knowledge?{query}")
            assert shown in r.text and f"/ui/knowledge/{hidden}" not in r.text, query
        assert "No learning matches" in (await u.client.get("/ui/knowledge?q=kubernetes")).text
        bad = await u.client.get("/ui/knowledge?type=gossip")
        assert bad.status_code == 422 and "Traceback" not in bad.text

        page = await u.client.get("/ui/knowledge/lrn-acme-planted")
        assert page.status_code == 200, page.text
        tags = elements(page.text)
        assert not [a for t, a in tags if t == "img" or a.get("id") == "planted"]
        assert not [a for _, a in tags if any(k.startswith("on") for k in a)]
        assert page.text.count("&lt;b id=&#34;planted&#34;&gt;") == 3  # title, body, reason
        assert "0.5000 → 0.5900" in page.text and 'href="/ui/jobs/job-1"' in page.text
        assert "abc123" in page.text and 'href="/ui/jobs/job-2"' in page.text  # given to
        for r in (listing, page):
            assert "unsafe-inline" not in r.headers["content-security-policy"]
            assert [a for t, a in elements(r.text) if t == "script" and not a.get("src")] == []
        assert (await u.client.get("/ui/knowledge/lrn-globex-1")).status_code == 404
        assert (await u.client.get("/ui/knowledge/acme-planted")).status_code == 404
        u.client.cookies.clear()
        assert (await u.client.get("/ui/knowledge")).status_code in (303, 401)

    with_ui(config(tmp_path), body)
