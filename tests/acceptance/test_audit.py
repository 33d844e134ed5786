"""The keyed audit chain through the real engine and the real `corral audit verify` on a real data
directory: the key and the signed checkpoints outside the database, and what someone
who can write the database (but not read the key) cannot hide."""

from __future__ import annotations

import json
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from corral.store.chain import CHAINS, link
from tests.acceptance.conftest import CONFIG, Corral
from tests.helpers import eventually


def run_jobs(corral: Corral, n: int = 2) -> list[str]:
    """`n` jobs run to their end and reported, then the engine stopped cleanly."""
    corral.serve()
    jobs = [corral.submit("true") for _ in range(n)]
    for job in jobs:
        assert corral.wait(job) == 0
        eventually(lambda j=job: corral.run("report", j).returncode == 0, what="the report")
    corral.stop_all()
    return jobs


@contextmanager
def around_triggers(corral: Corral, table: str) -> Iterator[sqlite3.Connection]:
    """The database with `table`'s append-only triggers dropped, put back after."""
    db = sqlite3.connect(corral.data / "corral.db", isolation_level=None)
    db.row_factory = sqlite3.Row
    guards = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (table,)
    ).fetchall()
    for g in guards:
        db.execute(f"DROP TRIGGER {g['name']}")
    try:
        yield db
    finally:
        for g in guards:
            db.execute(g["sql"])
        db.close()


def chain(db: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    return [
        dict(r) for r in db.execute(f"SELECT * FROM {table} WHERE seq IS NOT NULL ORDER BY seq")
    ]


def verify(corral: Corral) -> tuple[int, str]:
    r = corral.run("audit", "verify")
    return r.returncode, r.stdout + r.stderr


def test_a_clean_chain_verifies_with_its_key_and_checkpoints_private(corral: Corral) -> None:
    run_jobs(corral)
    key, marks = corral.data / "audit.key", corral.data / "audit-checkpoints.jsonl"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(marks.stat().st_mode) == 0o600
    written = {json.loads(line)["chain"] for line in marks.read_text().splitlines()}
    assert {"job_events", "run_reports"} <= written  # the clean stop's checkpoint at least
    code, out = verify(corral)
    assert code == 0, out
    assert out.startswith("audit ok: ") and "every chain intact" in out
    assert f"{len(marks.read_text().splitlines())} checkpoints matched" in out
    report = corral.json("audit", "verify")
    assert report["ok"] and report["checkpoints"] >= 2 and report["problems"] == []


def test_the_newest_records_removed_with_the_head_rewound_are_found(corral: Corral) -> None:
    run_jobs(corral)
    with around_triggers(corral, "job_events") as db:
        rows = chain(db, "job_events")
        keep = rows[:-2]
        db.execute("DELETE FROM job_events WHERE seq > ?", (keep[-1]["seq"],))
        db.execute(
            "UPDATE audit_heads SET seq = ?, hash = ? WHERE chain = 'job_events'",
            (keep[-1]["seq"], keep[-1]["hash"]),
        )
    code, out = verify(corral)
    assert code == 1
    assert (
        f"job_events row {keep[-1]['seq']}: chain job_events: 2 records after seq"
        f" {keep[-1]['seq']} missing (checkpoint at "
    ) in out
    assert f"says head seq {rows[-1]['seq']})" in out


def test_a_chain_recomputed_after_an_edit_is_found(corral: Corral) -> None:
    run_jobs(corral)
    with around_triggers(corral, "run_reports") as db:
        rows = chain(db, "run_reports")
        rows[0]["summary"] = "all good, nothing to see"
        prev = ""
        for r in rows:  # recomputed the only way open without the key: plain SHA-256
            r.update(link("run_reports", r, r["seq"], prev))
            prev = r["hash"]
            db.execute(
                "UPDATE run_reports SET summary = ?, prev_hash = ?, hash = ? WHERE id = ?",
                (r["summary"], r["prev_hash"], r["hash"], r["id"]),
            )
        db.execute(
            "UPDATE audit_heads SET hash = ?, keyed_from = NULL WHERE chain = 'run_reports'",
            (prev,),
        )
    code, out = verify(corral)
    assert code == 1
    assert (
        f"run_reports row {rows[0]['id']}: record seq 1 has a plain hash inside the keyed"
        " part" in out
    )
    assert f"record seq {rows[-1]['seq']} differs from the checkpoint at" in out


def test_an_edited_job_timeline_is_found(corral: Corral) -> None:
    [job, _] = run_jobs(corral)
    with around_triggers(corral, "job_events") as db:
        [(event_id,)] = db.execute(
            "SELECT id FROM job_events WHERE job_id = ? AND kind = 'submitted'", (job,)
        ).fetchall()
        db.execute(
            "UPDATE job_events SET message = 'submitted by someone else' WHERE id = ?", (event_id,)
        )
    code, out = verify(corral)
    assert code == 1
    assert (
        f"job_events row {event_id}: record seq" in out
        and "changed: its HMAC does not match" in out
    )
    db = sqlite3.connect(corral.data / "corral.db")
    try:  # the timeline itself refuses changes while its triggers are in place
        for sql in ("UPDATE job_events SET message = 'x'", "DELETE FROM job_events"):
            try:
                db.execute(sql)
            except sqlite3.IntegrityError as err:
                assert "job_events is append-only" in str(err)
            else:
                raise AssertionError(f"{sql} was allowed")
    finally:
        db.close()


def test_the_engine_refuses_to_serve_without_an_append_only_trigger(corral: Corral) -> None:
    run_jobs(corral, 1)
    db = sqlite3.connect(corral.data / "corral.db", isolation_level=None)
    db.execute("DROP TRIGGER job_events_no_update")
    db.close()
    r = corral.run("serve", timeout=60)
    assert r.returncode != 0
    [line] = [line for line in r.stderr.splitlines() if line.strip()]  # one line, no traceback
    assert line.startswith(
        "corral: error: the store's append-only trigger job_events_no_update"
        " is missing or disabled: refusing to serve"
    )
    code, out = verify(corral)
    assert code == 1 and "trigger job_events_no_update: append-only trigger missing" in out
    assert corral.ok("audit", "restore-triggers") == "restored 1 trigger(s): job_events_no_update\n"
    assert verify(corral)[0] == 0
    corral.serve()  # serves again
    job = corral.submit("true")
    assert corral.wait(job) == 0


def test_the_engine_checkpoints_while_it_runs(corral: Corral) -> None:
    corral.config.write_text(
        CONFIG + "audit:\n  checkpoint_every_records: 1\n  checkpoint_every_s: 3600\n"
    )
    corral.serve()
    job = corral.submit("true")
    assert corral.wait(job) == 0
    marks = corral.data / "audit-checkpoints.jsonl"

    def checkpointed() -> bool:
        if not marks.exists():
            return False
        return "job_events" in {
            json.loads(line)["chain"] for line in marks.read_text().splitlines()
        }

    eventually(checkpointed, what="a checkpoint of the job timeline while the engine runs")
    assert set(CHAINS) >= {json.loads(line)["chain"] for line in marks.read_text().splitlines()}
    code, out = verify(corral)
    assert code == 0, out


def test_the_engine_refuses_to_serve_when_the_key_of_its_records_is_gone(corral: Corral) -> None:
    run_jobs(corral, 1)
    (corral.data / "audit.key").rename(corral.work / "audit.key.bak")
    r = corral.run("serve", timeout=60)
    assert r.returncode != 0
    [line] = [line for line in r.stderr.splitlines() if line.strip()]
    assert line.startswith(
        f"corral: error: the audit key {corral.data / 'audit.key'} is missing, but the records of "
    )
    assert not (corral.data / "audit.key").exists()  # no new key made up in its place
    code, out = verify(corral)
    assert code == 1 and "keyed records cannot be checked: no audit key" in out
    (corral.work / "audit.key.bak").rename(corral.data / "audit.key")  # back from the backup
    assert verify(corral)[0] == 0
