"""The world model end to end with real processes: a parent of a role with one slot submits a
child of the same role from inside and waits for it with `corral wait`. The child can never
start (the parent holds the only slot), the parent never ends (it waits for the child): the
engine reports the deadlock with that cycle, once, and stops neither job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
