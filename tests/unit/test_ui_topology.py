"""The dashboard's topology view: the drawing's layout (ui/topology.py) readable at 50 jobs —
every job a box, no two boxes on top of each other, a child one column right of its parent,
each edge from its job's box to its target's, a deadlock marked — and the page itself: inline
SVG with the tenant's jobs and edges, every text an agent wrote escaped, no script."""

from __future__ import annotations

import itertools
from pathlib import Path

from corral.domain.states import JobState
from corral.ui.topology import BOX_H, BOX_W, layout
from corral.world.model import AgentView, CausalLink, Deadlock, Edge, World
from tests.contract.test_store_contract import NOW, claim, make_job
from tests.unit.test_api_jobs import config
from tests.unit.test_ui import PLANT, Ui, elements, with_ui

R, Q = JobState.RUNNING, JobState.QUEUED


def fifty() -> World:
    """A root running job, seven children, six grandchildren each (50 jobs), the last two
    grandchildren waiting on each other, and a job blocked behind the root."""
    edges: list[Edge] = []
    causal = [CausalLink(job_id="root", root_id="root", parent_id=None, role="planner", state=R)]
    for c in range(7):
        child = f"c{c}"
        edges.append(Edge(kind="spawned_by", source=child, target="root"))
        causal.append(
            CausalLink(job_id=child, root_id="root", parent_id="root", role="coder", state=R)
        )
        for g in range(6):
            leaf = f"c{c}g{g}"
            edges.append(Edge(kind="spawned_by", source=leaf, target=child))
            causal.append(
                CausalLink(job_id=leaf, root_id="root", parent_id=child, role="test", state=Q)
            )
    cycle = (
        Edge(kind="waits_for", source="c6g4", target="c6g5"),
        Edge(kind="waits_for", source="c6g5", target="c6g4"),
    )
    edges += [*cycle, Edge(kind="blocked_by", source="later", target="root")]
    agent = AgentView(
        job_id="root",
        attempt=1,
        role="planner",
        kind="process",
        state=R,
        worker="process",
        env="local",
        tenant="acme",
        started_at=NOW,
        tool_calls=3,
        current_tool=None,
        session_id=None,
    )
    return World(
        at=NOW,
        agents=(agent,),
        environments=(),
        edges=tuple(edges),
        causal=tuple(causal),
        deadlocks=(Deadlock(jobs=("c6g4", "c6g5"), edges=cycle),),
    )


def test_fifty_jobs_are_laid_out_in_generations_without_overlap() -> None:
    w = fifty()
    d = layout(w)
    at = {n.job_id: n for n in d.nodes}
    assert len(at) == 51 and d.left_out == 0  # 50 in the tree and the blocked one
    boxes = sorted((n.x, n.y) for n in d.nodes)
    assert len(set(boxes)) == len(boxes)
    for a, b in itertools.pairwise(boxes):  # same column: a row apart at least
        assert a[0] != b[0] or b[1] - a[1] >= BOX_H
    for e in w.edges:
        if e.kind == "spawned_by":
            assert at[e.source].x > at[e.target].x  # a child right of its parent
    assert {n.x for n in d.nodes} == {at["root"].x, at["c0"].x, at["c0g0"].x}  # 3 generations
    assert 0 < d.width < 1000 and d.height < 60 * 50  # three columns: a page wide at most
    for line in d.lines:
        s, t = at[line.source], at[line.target]
        assert line.x1 in (s.x, s.x + BOX_W) and line.y1 == s.y + BOX_H / 2
        assert line.x2 in (t.x, t.x + BOX_W) and line.y2 == t.y + BOX_H / 2
    assert {n.job_id for n in d.nodes if n.deadlocked} == {"c6g4", "c6g5"}
    assert {(line.source, line.target) for line in d.lines if line.deadlocked} == {
        ("c6g4", "c6g5"),
        ("c6g5", "c6g4"),
    }
    assert at["root"].running and (at["root"].role, at["root"].state) == ("planner", "RUNNING")
    assert at["later"].role == ""  # a job only the edges know: no label to show


def test_past_the_limit_the_deadlocked_and_running_jobs_are_drawn_first() -> None:
    d = layout(fifty(), limit=3)
    assert {n.job_id for n in d.nodes} == {"c6g4", "c6g5", "root"} and d.left_out == 48
    assert all(line.source in {"c6g4", "c6g5", "root"} for line in d.lines)


def test_the_page_draws_the_tenants_topology_and_escapes_what_agents_wrote(
    tmp_path: Path,
) -> None:
    async def body(u: Ui) -> None:
        parent = make_job(tenant="acme")
        await u.store.submit(parent, now=NOW, aging_s=60)
        await u.store.start_attempts([claim(parent)], now=NOW)
        child = make_job(tenant="acme", parent_id=parent.id, depth=1, role=PLANT)
        await u.store.submit(child, now=NOW, aging_s=60)
        blocked = make_job(tenant="acme", after=(parent.id,))
        await u.store.submit(blocked, now=NOW, aging_s=60)
        other = make_job(tenant="globex", parent_id=parent.id, depth=1)
        await u.store.submit(other, now=NOW, aging_s=60)
        await u.login("admin")
        r = await u.client.get("/ui/topology")
        assert r.status_code == 200, r.text
        tags = elements(r.text)
        drawn = {a["data-job"] for t, a in tags if t == "g" and a.get("data-job")}
        assert drawn == {parent.id, child.id, blocked.id}  # not another tenant's
        kinds = {
            (a["data-source"], a["data-kind"]) for t, a in tags if t == "path" and "data-kind" in a
        }
        assert kinds == {(child.id, "spawned_by"), (blocked.id, "blocked_by")}
        assert [t for t, _ in tags if t == "svg"] == ["svg"]
        assert not any(t == "b" and a.get("id") == "planted" for t, a in tags)
        assert not any(t == "img" for t, _ in tags)
        assert [a.get("src") for t, a in tags if t == "script"] == ["/ui/static/htmx.min.js"]
        assert "&lt;script&gt;" in r.text
        assert f'href="/ui/jobs/{child.id}"' in r.text
        nav = await u.client.get("/ui/")
        assert 'href="/ui/topology"' in nav.text

    with_ui(config(tmp_path), body)
