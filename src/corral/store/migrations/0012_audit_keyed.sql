-- Corral schema v12: a keyed audit chain, and the job timeline on one (SQLite;
-- PostgreSQL has 0012_audit_keyed.postgres.sql). `audit_heads.keyed_from`: the first seq of each
-- chain hashed with HMAC-SHA256 under the key outside the database (store/chain.py); rows before
-- it stay plain SHA-256. job_events gets its chain columns (rows from before stay off the chain)
-- and becomes append-only like the governance tables (0006).
ALTER TABLE audit_heads ADD COLUMN keyed_from INTEGER;
ALTER TABLE job_events ADD COLUMN seq INTEGER;
ALTER TABLE job_events ADD COLUMN prev_hash TEXT;
ALTER TABLE job_events ADD COLUMN hash TEXT;
CREATE UNIQUE INDEX job_events_chain ON job_events (seq);
CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
