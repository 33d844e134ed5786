"""`/api/v1/knowledge` (api/knowledge.py): the token's tenant's learnings listed, searched,
filtered by kind, role, tier and status, shown with provenance and history; promoted and
retired with `govern`, recorded as the token's; the A/B statistics of the tenant only. A token
of tenant A never sees, changes or counts tenant B's learnings."""

from __future__ import annotations

from pathlib import Path

from corral.domain.knowledge import Arm, KnowledgeRun, LearningKind, LearningStatus, Tier
from corral.services import tokens
from tests.contract.test_knowledge_contract import created, make
from tests.unit.test_api_jobs import Api, assert_problem, config, with_api

SCRIPT = "<script>alert(1)</script>"


async def seed(api: Api) -> None:
    items = [
        make(
            "lrn-acme-gold",
            "Pin the seed",
            "Use `random.seed(0)` in tests/conftest.py",
            tenant="acme",
        ),
        make(
            "lrn-acme-pending",
            f"Docker cache {SCRIPT}",
            "Docker layers are cached between builds",
            tenant="acme",
            role="ops",
            status=LearningStatus.PENDING,
            at=1_700_000_001.0,
        ).with_(kind=LearningKind.LEARNING, tier=Tier.BRONZE),
        make("lrn-globex-1", "Pin the seed", "Use `random.seed(0)` in globex", tenant="globex"),
    ]
    for x in items:
        assert await api.store.add_learning(x, created(x))
    for tenant, job, arm in (("acme", "j-a", Arm.WITH), ("globex", "j-g", Arm.WITHOUT)):
        run = KnowledgeRun(
            job_id=job,
            attempt=1,
            tenant=tenant,
            role="coder",
            arm=arm,
            reason="r",
            injected=0,
            started_at=1.0,
        )
        await api.store.record_injection(run, [])
        await api.store.settle_run(job, succeeded=True, tool_calls=2, reward=None, updates=[])


async def governor(api: Api, tenant: str = "acme") -> dict[str, str]:
    made = await tokens.create(api.store, tenant=tenant, scopes="govern", by="test")
    return {"Authorization": f"Bearer {made.text}"}


def test_a_tenants_learnings_listed_searched_and_shown(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        await seed(api)
        h = api.auth("reader")
        got = await api.client.get("/api/v1/knowledge", headers=h)
        assert got.status_code == 200, got.text
        assert [x["id"] for x in got.json()["learnings"]] == ["lrn-acme-pending", "lrn-acme-gold"]
        assert got.json()["learnings"][0]["title"] == f"Docker cache {SCRIPT}"  # JSON: data
        for query, want in (
            ("q=seed", ["lrn-acme-gold"]),
            ("q=docker&status=pending", ["lrn-acme-pending"]),
            ("q=docker&status=active", []),
            ("type=learning", ["lrn-acme-pending"]),
            ("tier=gold", ["lrn-acme-gold"]),
            ("role=ops", ["lrn-acme-pending"]),
            ("q=globex", []),  # another tenant's words
            ("ref=acme-gold", ["lrn-acme-gold"]),  # a suffix
            ("ref=lrn-&q=docker", ["lrn-acme-pending", "lrn-acme-gold"]),  # ref wins over q
            ("ref=globex-1", []),  # another tenant's, by a suffix: not found either
            ("ref=lrn", []),  # too short for a prefix: a whole id only
        ):
            r = await api.client.get(f"/api/v1/knowledge?{query}", headers=h)
            assert [x["id"] for x in r.json()["learnings"]] == want, query
        for bad in ("type=gossip", "tier=platinum", "status=bogus", "limit=0"):
            r = await api.client.get(f"/api/v1/knowledge?{bad}", headers=h)
            assert r.status_code == 422 and "Traceback" not in r.text, bad

        shown = (await api.client.get("/api/v1/knowledge/lrn-acme-gold", headers=h)).json()
        assert shown["provenance"] == {"job_id": "job-1", "attempt": 1, "commit": "abc123"}
        assert [x["action"] for x in shown["history"]] == ["created"]
        for ref in ("lrn-globex-1", "acme-gold", "nope"):  # another tenant's; a prefix; none
            r = await api.client.get(f"/api/v1/knowledge/{ref}", headers=h)
            assert_problem(r, 404, "not_found")
        r = await api.client.get("/api/v1/knowledge", headers=api.auth(None))
        assert r.status_code == 401
        r = await api.client.get("/api/v1/knowledge", headers=api.auth("scraper"))
        assert_problem(r, 403, "not_permitted")

    with_api(config(tmp_path), body)


def test_promote_and_retire_need_govern_and_stay_in_the_tenant(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        await seed(api)
        base = "/api/v1/knowledge"
        r = await api.client.post(f"{base}/lrn-acme-pending/promote", headers=api.auth("writer"))
        assert_problem(r, 403, "not_permitted")
        h = await governor(api)
        r = await api.client.post(f"{base}/lrn-globex-1/retire", json={"reason": "x"}, headers=h)
        assert_problem(r, 404, "not_found")
        r = await api.client.post(
            f"{base}/lrn-acme-pending/promote", json={"note": "checked"}, headers=h
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "active"
        r = await api.client.post(f"{base}/lrn-acme-pending/promote", headers=h)
        assert_problem(r, 422, "invalid_request")  # not pending any more
        r = await api.client.post(f"{base}/lrn-acme-gold/retire", json={}, headers=h)
        assert r.status_code == 422
        r = await api.client.post(
            f"{base}/lrn-acme-gold/retire", json={"reason": "obsolete"}, headers=h
        )
        assert r.json()["status"] == "retired"
        shown = (
            await api.client.get(f"{base}/lrn-acme-pending", headers=api.auth("reader"))
        ).json()
        last = shown["history"][-1]
        assert (last["action"], last["reason"]) == ("promoted", "checked")
        assert last["actor"].startswith("token:")
        theirs = await api.store.get_learning("lrn-globex-1")
        assert theirs.status is LearningStatus.ACTIVE  # untouched

    with_api(config(tmp_path), body)


def test_the_stats_count_the_tokens_tenant_only(tmp_path: Path) -> None:
    async def body(api: Api) -> None:
        await seed(api)
        r = await api.client.get("/api/v1/knowledge/stats", headers=api.auth("reader"))
        assert r.status_code == 200, r.text
        stats = r.json()
        assert stats["learnings"] == {"active": 1, "pending": 1, "retired": 0}
        [role] = stats["roles"]
        assert role["role"] == "coder" and role["without"] is None  # globex's run: not here
        assert (role["with"]["runs"], role["with"]["tool_calls"]) == (1, 2)
        r = await api.client.get("/api/v1/knowledge/stats", headers=api.auth("other"))
        assert r.json()["learnings"] == {"active": 1, "pending": 0, "retired": 0}

    with_api(config(tmp_path), body)
