-- Corral schema v17: retention (services/retention.py, docs/how-to/retention.md). Old terminal
-- jobs leave the store after their rows were written to an archive file. The two chains that
-- belong to jobs (the timeline and the policy evaluations) lose a whole segment at a time, from
-- the start of what is kept up to a point: `archive_heads` records, per chain, the last seq
-- archived and its hash (verification starts there), `archives` every archive file written with
-- the segments it holds, and `gc_lease` the one engine collecting at a time. The append-only
-- triggers of those two tables now allow a DELETE of rows at or below the archived head only
-- (PostgreSQL: one trigger function that lets such a DELETE through).
CREATE TABLE archive_heads (
    chain TEXT PRIMARY KEY,
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
);
CREATE TABLE archives (
    id       BIGSERIAL PRIMARY KEY,
    at       DOUBLE PRECISION NOT NULL,
    file     TEXT NOT NULL,
    jobs     INTEGER NOT NULL,
    segments TEXT NOT NULL
);
CREATE TABLE gc_lease (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    lease_until DOUBLE PRECISION NOT NULL
);
CREATE FUNCTION corral_append_only_archived() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF TG_OP = 'DELETE' AND OLD.seq IS NOT NULL AND OLD.seq <= COALESCE((SELECT a.seq FROM archive_heads a WHERE a.chain = TG_TABLE_NAME), 0) THEN RETURN OLD; END IF; RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = TG_TABLE_NAME || ' is append-only'; END $$;
DROP TRIGGER job_events_append_only ON job_events;
DROP TRIGGER policy_evaluations_append_only ON policy_evaluations;
CREATE TRIGGER job_events_append_only BEFORE UPDATE OR DELETE ON job_events FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
CREATE TRIGGER policy_evaluations_append_only BEFORE UPDATE OR DELETE ON policy_evaluations FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
