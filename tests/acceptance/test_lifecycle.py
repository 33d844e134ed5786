"""A job's life through the real `corral` command: success, retries into the DLQ, timeouts,
cancellation of whole process trees, idempotency keys, dependencies and priorities."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

from corral.workers.proctab import alive
from tests.acceptance.conftest import CONFIG, CORRAL, Corral
from tests.helpers import eventually


def test_submit_wait_runs_a_job_and_records_it(corral: Corral) -> None:
    corral.serve()
    r = corral.run("submit", "--wait", "--", "sh", "-c", "echo out; echo err >&2; exit 0")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    job = corral.job(job_id)
    assert job["state"] == "SUCCEEDED"
    assert [a["state"] for a in job["attempts"]] == ["SUCCEEDED"]
    assert job["attempts"][0]["exit_code"] == 0
    assert job["attempts"][0]["started"] and job["attempts"][0]["ended"]
    kinds = [e["kind"] for e in job["timeline"]]
    assert kinds[0] == "submitted" and kinds[-1] == "ended" and "permit_granted" in kinds
    assert job["timeline"][0]["data"]["by"] == getpass.getuser()  # who asked, on the record
    logs = corral.run("logs", job_id)
    assert logs.stdout == "out\n" and logs.stderr == "err\n"
    listed = corral.json("jobs")
    assert {"id", "state", "role", "priority", "attempts"} <= set(listed[0])
    assert listed[0]["id"] == job_id and listed[0]["attempts"] == 1


def test_failures_retry_with_backoff_into_the_dlq_and_requeue_is_recorded(corral: Corral) -> None:
    # Six failures in a row would open the `command` breaker for 30 s: not what this test is about.
    corral.config.write_text(CONFIG + "breakers: {min_calls: 100, consecutive_failures: 100}\n")
    corral.serve()
    r = corral.run("submit", "--wait", "--max-attempts", "3", "--", "sh", "-c", "exit 3")
    assert r.returncode == 3
    job_id = r.stdout.strip()
    job = corral.job(job_id)
    assert job["state"] == "DEAD_LETTERED"
    assert [a["exit_code"] for a in job["attempts"]] == [3, 3, 3]
    assert "retries exhausted" in job["last_error"]
    kinds = [e["kind"] for e in job["timeline"]]
    assert kinds.count("retry_scheduled") == 2 and kinds.count("requeued") == 2
    assert [j["id"] for j in corral.json("dlq", "list")] == [job_id]

    new_id = corral.json("dlq", "requeue", job_id)["id"]
    waited = corral.run("wait", new_id, "--json")
    assert waited.returncode == 3
    assert json.loads(waited.stdout)["state"] == "DEAD_LETTERED"
    assert corral.job(new_id)["requeued_from"] == job_id
    assert corral.job(job_id)["dlq_resolution"] == f"requeued:{new_id}"
    again = corral.run("dlq", "requeue", job_id)
    assert again.returncode == 5 and "already resolved" in again.stderr
    assert corral.ok("dlq", "purge", new_id).strip() == "purged 1 job(s)"
    assert corral.json("dlq", "list") == []


def test_a_non_retryable_failure_is_never_retried(corral: Corral) -> None:
    corral.serve()
    r = corral.run("submit", "--wait", "--", "/no/such/program")
    assert r.returncode == 127  # as a shell reports a missing program
    job = corral.job(r.stdout.strip())
    assert job["state"] == "FAILED" and len(job["attempts"]) == 1
    assert "No such file" in job["attempts"][0]["error"]


def test_deadline_stops_the_whole_tree_and_times_out(corral: Corral, tmp_path: Path) -> None:
    corral.serve()
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! >> {pids}; setsid sleep 60 & echo $! >> {pids}; wait"
    r = corral.run("submit", "--wait", "--timeout", "1", "--grace", "0.5", "--", "sh", "-c", script)
    assert r.returncode == 124
    job = corral.job(r.stdout.strip())
    assert job["state"] == "TIMED_OUT" and job["limit_hit"] == "max_duration_s"
    assert len(job["attempts"]) == 1  # timeouts are not retried by default
    children = [int(p) for p in pids.read_text().split()]
    assert len(children) == 2 and not any(alive(p) for p in children)


def test_sigterm_ignoring_job_is_killed_after_the_grace(corral: Corral) -> None:
    corral.serve()
    r = corral.run(
        "submit",
        "--wait",
        "--timeout",
        "0.5",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        "trap '' TERM; sleep 30",
    )
    assert r.returncode == 124
    attempt = corral.job(r.stdout.strip())["attempts"][0]
    assert attempt["signal"] == 9 and attempt["state"] == "TIMED_OUT"


def test_cancel_running_job_kills_children_and_setsid_grandchildren(
    corral: Corral, tmp_path: Path
) -> None:
    corral.serve()
    pids = tmp_path / "pids"
    script = (
        f"setsid sh -c 'sleep 60 & echo $! >> {pids}; wait' & sleep 60 & echo $! >> {pids}; wait"
    )
    job_id = corral.submit("sh", "-c", script)
    eventually(lambda: pids.exists() and len(pids.read_text().split()) == 2, what="two children")
    children = [int(p) for p in pids.read_text().split()]
    assert all(alive(p) for p in children)
    out = corral.ok("cancel", job_id, "--reason", "operator changed their mind")
    assert "cancel requested" in out
    assert corral.wait(job_id) == 130
    job = corral.job(job_id)
    assert job["state"] == "CANCELLED" and job["cancel_requested"] == "operator changed their mind"
    assert job["attempts"][0]["state"] == "CANCELLED"
    assert not any(alive(p) for p in children)
    again = corral.run("cancel", job_id)
    assert again.returncode == 5 and "already CANCELLED" in again.stderr


def test_cancel_queued_job_without_an_engine(corral: Corral) -> None:
    job_id = corral.submit("true")
    out = corral.ok("cancel", job_id)
    assert out.strip() == f"{job_id} CANCELLED"
    assert corral.job(job_id)["attempts"] == []


def test_idempotency_keys_coalesce_reject_and_latest_wins(corral: Corral) -> None:
    first = corral.submit("sleep", "30", opts=("--key", "k1"))
    r = corral.run("submit", "--key", "k1", "--", "sleep", "30")
    assert r.stdout.strip() == first and "coalesced" in r.stderr
    rej = corral.run("submit", "--key", "k1", "--dedup", "reject", "--", "true")
    assert rej.returncode == 5 and first in rej.stderr
    corral.serve()
    assert corral.wait(first, until="running") == 0
    newer = corral.submit("true", opts=("--key", "k1", "--dedup", "latest-wins"))
    assert newer != first
    assert corral.wait(first) == 130
    assert "superseded by" in corral.job(first)["cancel_requested"]
    superseded = Path(corral.job(first)["attempts"][0]["log_dir"])
    assert not alive(int((superseded / "child.pid").read_text())), "no residue"
    assert corral.wait(newer) == 0
    # released on success: the key now makes a new job
    assert corral.submit("true", opts=("--key", "k1")) not in (first, newer)


def test_dependencies_run_in_order_and_failures_propagate(corral: Corral) -> None:
    a = corral.submit("sh", "-c", "sleep 0.3")
    b = corral.submit("true", opts=("--after", a))
    bad = corral.submit("sh", "-c", "exit 2", opts=("--max-attempts", "1"))
    c = corral.submit("true", opts=("--after", bad))
    d = corral.submit("true", opts=("--after", c))
    missing = corral.run("submit", "--after", "01nosuchjob0000000000000000", "--", "true")
    assert missing.returncode == 4 and "names no job" in missing.stderr
    corral.drain()
    ja, jb = corral.job(a), corral.job(b)
    assert jb["state"] == "SUCCEEDED"
    assert jb["attempts"][0]["started"] >= ja["attempts"][0]["ended"]
    assert corral.job(bad)["state"] == "DEAD_LETTERED"  # retryable, but its one try is spent
    for dependent, cause, how in ((c, bad, "DEAD_LETTERED"), (d, c, "FAILED")):
        job = corral.job(dependent)
        assert job["state"] == "FAILED" and job["attempts"] == []
        assert job["last_error"] == f"dependency {cause} ended {how}"


def test_priority_order_and_fifo_within_a_priority(corral: Corral) -> None:
    ids = {}
    for name, prio in (("low", "4"), ("mid1", "2"), ("crit", "0"), ("mid2", "2")):
        ids[name] = corral.submit("true", opts=("--role", "serial", "--priority", prio))
    corral.drain()
    started = sorted(ids, key=lambda n: corral.job(ids[n])["attempts"][0]["started"])
    assert started == ["crit", "mid1", "mid2", "low"]


def test_100_mb_of_output_without_newlines_lands_whole_in_the_log(corral: Corral) -> None:
    corral.serve()
    r = corral.run("submit", "--wait", "--", "head", "-c", "104857600", "/dev/zero")
    assert r.returncode == 0, r.stderr
    attempt = corral.job(r.stdout.strip())["attempts"][0]
    assert (Path(attempt["log_dir"]) / "stdout.log").stat().st_size == 104857600
    engine_rss_kb = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{corral.engines[0].pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
    )
    assert engine_rss_kb < 200_000  # the output went to a file, never through the engine


def test_jobs_that_submit_jobs_are_bounded_by_the_recursion_depth(
    corral: Corral, tmp_path: Path
) -> None:
    corral.config.write_text(
        corral.config.read_text().replace(
            "  serial:",
            "  chain:\n    concurrency: 4\n    max_recursion_depth: 3\n"
            "    limits: {max_attempts: 1}\n  serial:",
        )
    )
    spawner = tmp_path / "spawn.sh"
    spawner.write_text(f"#!/bin/sh\nexec {CORRAL} submit --role chain -- {spawner}\n")
    spawner.chmod(0o755)
    root = corral.submit(str(spawner), opts=("--role", "chain"))
    corral.drain()
    chain = sorted(corral.json("jobs", "--limit", "20"), key=lambda j: j["created_at"])
    assert [j["id"] for j in chain][:1] == [root]
    depths = [corral.job(j["id"])["depth"] for j in chain]
    assert depths == [0, 1, 2, 3], "each job's child is one level deeper, up to the bound"
    assert [corral.job(j["id"])["parent_id"] for j in chain][1:] == [j["id"] for j in chain][:-1]
    deepest = chain[-1]
    assert deepest["exit_code"] == 2, "its own submission was refused (bad input)"
    logs = corral.run("logs", deepest["id"])
    assert "recursion depth 4 exceeds max_recursion_depth 3" in logs.stderr
