"""Cancelling a parent stops the jobs it submitted from inside (`corral submit` in a job records
its parent), down to the last process; a detached role's child runs on."""

from __future__ import annotations

from pathlib import Path

from corral.workers.proctab import alive
from tests.acceptance.conftest import CONFIG, CORRAL, Corral
from tests.helpers import eventually

TREE = CONFIG.replace("roles:\n", "roles:\n  loose:\n    concurrency: 4\n    detached: true\n")


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def test_cancelling_a_parent_leaves_no_child_process_alive(tmp_path: Path) -> None:
    c = Corral(tmp_path, TREE)
    try:
        work = c.work
        # The parent submits a child and a detached child from inside, then waits; each child
        # records its pid and sleeps far past the test.
        child = "echo $$ > child.pid; exec sleep 300"
        loose = "echo $$ > loose.pid; exec sleep 300"
        parent = (
            f"{CORRAL} submit --cwd {work} -- sh -c '{child}' > child.id && "
            f"{CORRAL} submit --role loose --cwd {work} -- sh -c '{loose}' > loose.id && "
            "echo $$ > parent.pid; exec sleep 300"
        )
        parent_id = c.submit("sh", "-c", parent, opts=("--cwd", str(work)))
        c.serve()
        child_pid = eventually(
            lambda: _pid(work / "child.pid"), timeout=30, what="the child running"
        )
        loose_pid = eventually(
            lambda: _pid(work / "loose.pid"), timeout=30, what="the detached child running"
        )
        parent_pid = eventually(lambda: _pid(work / "parent.pid"), what="the parent waiting")
        child_id = (work / "child.id").read_text().strip()
        loose_id = (work / "loose.id").read_text().strip()
        assert c.job(child_id)["parent_id"] == parent_id

        c.ok("cancel", parent_id, "--reason", "operator stopped the tree")
        assert c.wait(parent_id) != 0 and c.wait(child_id) != 0
        shown = c.job(child_id)
        assert shown["state"] == "CANCELLED"
        assert shown["cancel_requested"] == (
            f"parent {parent_id} was cancelled: operator stopped the tree"
        )
        assert "cancel_requested" in [e["kind"] for e in shown["timeline"]]
        eventually(
            lambda: not alive(child_pid) and not alive(parent_pid),
            what="the parent's and the child's processes gone",
        )

        detached = c.job(loose_id)
        assert detached["state"] == "RUNNING" and detached["detached"] is True
        assert alive(loose_pid), "a detached child outlives its parent"
        c.ok("cancel", loose_id)
        eventually(lambda: not alive(loose_pid), what="the detached child stopped on its own")
    finally:
        c.stop_all()
