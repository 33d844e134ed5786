-- Corral schema v26: retention archives every chain whose rows belong to jobs, not only the
-- timeline and the policy evaluations: a job's run report, its incidents and its approval events
-- go with it, as whole chain segments with their head hash (docs/how-to/retention.md). Their
-- append-only triggers now allow a DELETE of rows at or below the archived head only, as 0017
-- did for the first two (SQLite; PostgreSQL has 0026_archive_job_chains.postgres.sql).
DROP TRIGGER run_reports_no_delete;
DROP TRIGGER incidents_no_delete;
DROP TRIGGER approval_events_no_delete;
CREATE TRIGGER run_reports_no_delete BEFORE DELETE ON run_reports WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'run_reports'), 0) BEGIN SELECT RAISE(ABORT, 'run_reports is append-only'); END;
CREATE TRIGGER incidents_no_delete BEFORE DELETE ON incidents WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'incidents'), 0) BEGIN SELECT RAISE(ABORT, 'incidents is append-only'); END;
CREATE TRIGGER approval_events_no_delete BEFORE DELETE ON approval_events WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'approval_events'), 0) BEGIN SELECT RAISE(ABORT, 'approval_events is append-only'); END;
