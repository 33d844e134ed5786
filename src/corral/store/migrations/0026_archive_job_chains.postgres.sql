-- Corral schema v26 for PostgreSQL: the run reports, incidents and approval events of jobs
-- retention removes are archived as whole chain segments too (0026_archive_job_chains.sql); their
-- append-only triggers use 0017's function, which lets a DELETE at or below the archived head
-- through.
DROP TRIGGER run_reports_append_only ON run_reports;
DROP TRIGGER incidents_append_only ON incidents;
DROP TRIGGER approval_events_append_only ON approval_events;
CREATE TRIGGER run_reports_append_only BEFORE UPDATE OR DELETE ON run_reports FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
CREATE TRIGGER incidents_append_only BEFORE UPDATE OR DELETE ON incidents FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
CREATE TRIGGER approval_events_append_only BEFORE UPDATE OR DELETE ON approval_events FOR EACH ROW EXECUTE FUNCTION corral_append_only_archived();
