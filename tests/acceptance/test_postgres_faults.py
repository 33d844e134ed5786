"""Faults on PostgreSQL: the server ends the engine's connections; an engine pauses and a peer
takes its attempts over (fencing); an engine restarts on its data directory."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from corral.runtime.control import poke
from tests.acceptance.conftest import Corral
from tests.acceptance.invariants import invariants, runs_of, tracked
from tests.helpers import eventually
from tests.pg import PG_DSN, PgSchemas

pytestmark = pytest.mark.postgres

CONFIG = """\
scheduler: {poll_interval_s: 0.2}
engine: {heartbeat_s: 0.5, stale_after_s: 3}
roles:
  default: {concurrency: 8, retry: {base_s: 0.05, cap_s: 0.2}}
environments:
  local: {max_inflight: 8}
"""


class PgCorral(Corral):
    """A data directory whose engine and commands use one PostgreSQL schema."""

    def __init__(self, root: Path, dsn: str) -> None:
        # Engines on one database share its audit key (beside their data directories).
        super().__init__(root, CONFIG + f"audit: {{key_file: {root.parent / 'audit.key'}}}\n")
        self.dsn = dsn

    def env(self) -> dict[str, str]:
        env = super().env()
        env["CORRAL_STORE_URL"] = self.dsn
        return env


def _named(dsn: str, name: str) -> str:
    """The DSN with an application_name, so that the test can find its connections."""
    return f"{dsn}&application_name={name}"


def _sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5) as conn:
        return list(conn.execute(query, params).fetchall())


def _timeline(c: Corral, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in c.job(job_id)["timeline"] if e["kind"] == kind]


def test_the_server_terminating_the_engines_connections_is_ridden_out(
    tmp_path: Path, pg_schemas: PgSchemas
) -> None:
    name = f"corral_fault_{tmp_path.name[-20:]}"
    c = PgCorral(tmp_path, _named(pg_schemas.new(), name))
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    try:
        engine = c.serve()
        ids = [
            c.submit(*tracked(runs, f"while [ ! -e {gate} ]; do sleep 0.05; done"))
            for _ in range(3)
        ]
        eventually(lambda: len(runs_of(runs)) == 3, what="three attempts running")
        for i in ids:
            assert c.wait(i, until="running") == 0
        ended = _sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            name,
        )
        assert ended and all(r[0] for r in ended), "the engine's connections were ended"
        gate.touch()  # the attempts end: their ends are written on new connections
        for i in ids:
            assert c.wait(i) == 0, c.engine_log()
        assert engine.poll() is None, c.engine_log()
        assert "store unavailable" in c.engine_log()
        assert "store answers again" in c.engine_log()
        assert all(len(c.job(i)["attempts"]) == 1 for i in ids), "nothing ran twice"
        invariants(c, runs)
    finally:
        c.stop_all()


def test_a_peer_takes_over_a_paused_engine_which_is_fenced_when_it_wakes(
    tmp_path: Path, pg_schemas: PgSchemas
) -> None:
    dsn = pg_schemas.new()
    a, b = PgCorral(tmp_path / "a", dsn), PgCorral(tmp_path / "b", dsn)
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    try:
        old = a.serve()
        job_id = a.submit(*tracked(runs, f"while [ ! -e {gate} ]; do sleep 0.05; done"))
        assert a.wait(job_id, until="running") == 0
        b.serve()
        a_id, b_id = poke(a.data, "ping")["engine"], poke(b.data, "ping")["engine"]
        old.send_signal(signal.SIGSTOP)
        try:
            # The peer notices the missing heart-beats and adopts the running attempt.
            eventually(
                lambda: _timeline(b, job_id, "recovered"),
                timeout=60,
                what="the peer taking the attempt over",
            )
            gate.touch()
            assert b.wait(job_id) == 0, b.engine_log()
            other = b.submit(*tracked(runs, "true"))
            assert b.wait(other) == 0
        finally:
            old.send_signal(signal.SIGCONT)
        # The paused engine wakes: its writes are refused and it notices it lost its attempts.
        assert old.wait(timeout=30) == 3, a.engine_log()
        assert "declared dead by a peer" in a.engine_log()
        job = b.job(job_id)
        assert job["state"] == "SUCCEEDED" and len(job["attempts"]) == 1
        [recovered] = _timeline(b, job_id, "recovered")
        assert recovered["data"] == {"from_engine": a_id, "engine": b_id}
        schema = dsn.rsplit("%3D", 1)[-1]
        assert _sql(f'SELECT engine_id FROM "{schema}".attempts WHERE job_id = %s', job_id) == [
            (b_id,)
        ]
        assert _sql(f'SELECT id FROM "{schema}".engines WHERE fenced_at IS NOT NULL') == [(a_id,)]
        assert len(_timeline(b, job_id, "ended")) == 1
        assert [(j, n) for j, n, _ in runs_of(runs) if j == job_id] == [(job_id, 1)]
        invariants(b, runs)
    finally:
        a.stop_all()
        b.stop_all()


def test_a_restart_on_the_same_data_directory_re_adopts_at_once(
    tmp_path: Path, pg_schemas: PgSchemas
) -> None:
    c = PgCorral(tmp_path, pg_schemas.new())
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    try:
        engine = c.serve()
        job_id = c.submit(*tracked(runs, f"while [ ! -e {gate} ]; do sleep 0.05; done"))
        assert c.wait(job_id, until="running") == 0
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        c.serve()  # at once: the killed engine's heart-beat is still fresh
        assert poke(c.data, "ping")
        [recovered] = _timeline(c, job_id, "recovered")
        assert "served this data directory before" in recovered["message"]
        gate.touch()
        assert c.wait(job_id) == 0, c.engine_log()
        assert len(c.job(job_id)["attempts"]) == 1
        invariants(c, runs)
    finally:
        c.stop_all()
