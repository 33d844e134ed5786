-- Corral schema v12 for PostgreSQL: a keyed audit chain, and the job timeline on one
-- (see 0012_audit_keyed.sql); job_events refuses UPDATE, DELETE and TRUNCATE like 0006's tables.
ALTER TABLE audit_heads ADD COLUMN keyed_from INTEGER;
ALTER TABLE job_events ADD COLUMN seq INTEGER;
ALTER TABLE job_events ADD COLUMN prev_hash TEXT;
ALTER TABLE job_events ADD COLUMN hash TEXT;
CREATE UNIQUE INDEX job_events_chain ON job_events (seq);
CREATE TRIGGER job_events_append_only BEFORE UPDATE OR DELETE ON job_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER job_events_no_truncate BEFORE TRUNCATE ON job_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
