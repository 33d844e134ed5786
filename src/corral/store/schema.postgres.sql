-- Corral current schema, PostgreSQL only: appended to schema.sql by store/migrate.py.
-- The append-only tables refuse UPDATE, DELETE and TRUNCATE (PostgreSQL): changing history
-- takes dropping a trigger, and then the hash chain shows it (corral audit verify).
CREATE FUNCTION corral_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = TG_TABLE_NAME || ' is append-only'; END $$;
-- job_events and policy_evaluations: a DELETE of rows an archive holds passes (migration 0017)
CREATE FUNCTION corral_append_only_archived() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF TG_OP = 'DELETE' AND OLD.seq IS NOT NULL AND OLD.seq <= COALESCE((SELECT a.seq FROM archive_heads a WHERE a.chain = TG_TABLE_NAME), 0) THEN RETURN OLD; END IF; RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = TG_TABLE_NAME || ' is append-only'; END $$;
CREATE TRIGGER policy_evaluations_append_only BEFORE UPDATE OR DELETE ON policy_evaluations FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
CREATE TRIGGER policy_evaluations_no_truncate BEFORE TRUNCATE ON policy_evaluations FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER run_reports_append_only BEFORE UPDATE OR DELETE ON run_reports FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER run_reports_no_truncate BEFORE TRUNCATE ON run_reports FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER incidents_append_only BEFORE UPDATE OR DELETE ON incidents FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER incidents_no_truncate BEFORE TRUNCATE ON incidents FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER switch_events_append_only BEFORE UPDATE OR DELETE ON switch_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER switch_events_no_truncate BEFORE TRUNCATE ON switch_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER budget_ceilings_append_only BEFORE UPDATE OR DELETE ON budget_ceilings FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER budget_ceilings_no_truncate BEFORE TRUNCATE ON budget_ceilings FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER budget_ledger_append_only BEFORE UPDATE OR DELETE ON budget_ledger FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER budget_ledger_no_truncate BEFORE TRUNCATE ON budget_ledger FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER dark_launches_append_only BEFORE UPDATE OR DELETE ON dark_launches FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER dark_launches_no_truncate BEFORE TRUNCATE ON dark_launches FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER approval_events_append_only BEFORE UPDATE OR DELETE ON approval_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER approval_events_no_truncate BEFORE TRUNCATE ON approval_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER job_events_append_only BEFORE UPDATE OR DELETE ON job_events FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
CREATE TRIGGER job_events_no_truncate BEFORE TRUNCATE ON job_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER token_events_append_only BEFORE UPDATE OR DELETE ON token_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER token_events_no_truncate BEFORE TRUNCATE ON token_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
-- migration 0023: the learnings' full-text search column, their append-only history
ALTER TABLE learnings ADD COLUMN search tsvector GENERATED ALWAYS AS (to_tsvector('english', title || ' ' || body)) STORED;
CREATE INDEX learnings_search ON learnings USING GIN (search);
CREATE TRIGGER learning_events_append_only BEFORE UPDATE OR DELETE ON learning_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER learning_events_no_truncate BEFORE TRUNCATE ON learning_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
