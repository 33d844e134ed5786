-- Corral schema v17: retention (services/retention.py, docs/how-to/retention.md). Old terminal
-- jobs leave the store after their rows were written to an archive file. The two chains that
-- belong to jobs (the timeline and the policy evaluations) lose a whole segment at a time, from
-- the start of what is kept up to a point: `archive_heads` records, per chain, the last seq
-- archived and its hash (verification starts there), `archives` every archive file written with
-- the segments it holds, and `gc_lease` the one engine collecting at a time. The append-only
-- triggers of those two tables now allow a DELETE of rows at or below the archived head only
-- (SQLite; PostgreSQL has 0017_retention.postgres.sql).
CREATE TABLE archive_heads (
    chain TEXT PRIMARY KEY,
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
);
CREATE TABLE archives (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL NOT NULL,
    file     TEXT NOT NULL,
    jobs     INTEGER NOT NULL,
    segments TEXT NOT NULL
);
CREATE TABLE gc_lease (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    lease_until REAL NOT NULL
);
DROP TRIGGER job_events_no_delete;
DROP TRIGGER policy_evaluations_no_delete;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'job_events'), 0) BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TRIGGER policy_evaluations_no_delete BEFORE DELETE ON policy_evaluations WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'policy_evaluations'), 0) BEGIN SELECT RAISE(ABORT, 'policy_evaluations is append-only'); END;
