"""The world model end to end with real processes: a parent of a role with one slot submits a
child of the same role from inside and waits for it with `corral wait`. The child can never
start (the parent holds the only slot), the parent never ends (it waits for the child): the
engine reports the deadlock with that cycle, once, and stops neither job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.domain.ids import wandb_run_id
from corral.workers.rayjob import submission_id
from tests.acceptance.conftest import CONFIG, CORRAL, Corral
from tests.helpers import eventually


def _deadlocks(c: Corral) -> list[dict[str, Any]]:
    return [i for i in c.json("incidents") if i["type"] == "deadlock"]


def test_a_parent_waiting_on_a_child_that_needs_its_slot_is_reported(tmp_path: Path) -> None:
    c = Corral(tmp_path, CONFIG)
    try:
        work = c.work
        parent = (
            f"{CORRAL} submit --role serial -- true > child.id && "
            f"{CORRAL} wait --quiet $(cat child.id)"
        )
        parent_id = c.submit("sh", "-c", parent, opts=("--role", "serial", "--cwd", str(work)))
        c.serve()
        child_id = eventually(
            lambda: (work / "child.id").exists() and (work / "child.id").read_text().strip(),
            timeout=30,
            what="the child submitted",
        )
        (incident,) = eventually(lambda: _deadlocks(c), timeout=30, what="the deadlock raised")
        assert sorted(incident["context"]["cycle"]) == sorted([parent_id, child_id])
        edges = {
            (e["job_id"], e["relationship"], e["related_job_id"])
            for e in incident["context"]["edges"]
        }
        assert edges == {
            (parent_id, "waits_for", child_id),
            (child_id, "waits_for_slot", parent_id),
        }
        assert incident["severity"] == "critical"

        shown = c.json("world")
        (dead,) = shown["deadlocks"]
        assert sorted(dead["jobs"]) == sorted([parent_id, child_id])
        assert shown["agents"][parent_id]["role"] == "serial"
        assert c.job(parent_id)["state"] == "RUNNING"  # escalated, not stopped
        assert c.job(child_id)["state"] == "QUEUED"
        assert "wait_started" in [e["kind"] for e in c.job(parent_id)["timeline"]]
        assert len(_deadlocks(c)) == 1  # once, however many ticks went by

        c.ok("cancel", parent_id, "--reason", "broke the deadlock")  # the child goes with it
        assert c.wait(parent_id) != 0 and c.wait(child_id) != 0
        assert eventually(lambda: c.json("world")["deadlocks"] == [], what="the cycle gone")
    finally:
        c.stop_all()


def test_replay_of_a_job_three_levels_deep_returns_the_chain(tmp_path: Path) -> None:
    c = Corral(tmp_path, CONFIG)
    try:
        work = c.work
        grandchild = "echo leaf"
        child = f"{CORRAL} submit --wait -- sh -c '{grandchild}' > leaf.id"
        root = f'{CORRAL} submit --wait -- sh -c "{child}"'
        root_id = c.submit("sh", "-c", root, opts=("--cwd", str(work)))
        c.serve()
        assert c.wait(root_id, timeout=60) == 0
        leaf = (work / "leaf.id").read_text().strip()
        shown = c.json("replay", leaf)
        assert (shown["job_id"], shown["root_intent_id"]) == (leaf, root_id)
        jobs = shown["jobs"]
        assert [j["depth"] for j in jobs] == [0, 1, 2]
        assert jobs[0]["id"] == root_id and jobs[2]["id"] == leaf
        assert jobs[2]["parent_id"] == jobs[1]["id"] and jobs[1]["parent_id"] == root_id
        assert all(j["state"] == "SUCCEEDED" for j in jobs)
        steps = shown["steps"]
        assert [s["at"] for s in steps] == sorted(s["at"] for s in steps)
        assert {s["job_id"] for s in steps} == {j["id"] for j in jobs}
        waits = [s for s in steps if s["subject"] == "wait_started"]
        assert {s["job_id"] for s in waits} == {root_id, jobs[1]["id"]}  # each followed its child
        assert shown["audit"]["ok"] is True and not shown["cut"]
        text = c.ok("replay", leaf)
        assert f"root intent {root_id}" in text and "audit ok" in text
        # The same chain by what the leaf's first attempt would have started outside Corral:
        # its Ray submission id, or its W&B run id (the same shape, derived in one place each).
        for ref in (submission_id(leaf, 1), wandb_run_id(leaf, 1)):
            by_run = c.json("replay", ref)
            assert (by_run["job_id"], by_run["attempt"]) == (leaf, 1)
            assert by_run["jobs"] == jobs and by_run["steps"] == steps
        assert shown["attempt"] is None
        assert f"replay of {leaf} (attempt 1)" in c.ok("replay", submission_id(leaf, 1))
        for bad, why in (
            (submission_id(leaf, 2), f"job {leaf} has no attempt 2"),
            (wandb_run_id("0" * 26, 1), "no job 00000000000000000000000000"),
        ):
            r = c.run("replay", bad)
            assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr
    finally:
        c.stop_all()
