-- Corral schema v31: which terminal jobs still wait for their run report. The reporter looked
-- for them by joining every terminal job to its report: a scan of the whole history on every
-- look (34 ms at 100,000 jobs, and growing). A job is flagged once its report is written, and
-- the waiting ones are a small partial index.
ALTER TABLE jobs ADD COLUMN reported INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET reported = 1 WHERE id IN (SELECT job_id FROM run_reports);
CREATE INDEX jobs_unreported ON jobs (updated_at, id) WHERE reported = 0 AND state IN ('CANCELLED', 'DEAD_LETTERED', 'DENIED', 'FAILED', 'KILLED', 'SUCCEEDED', 'TIMED_OUT');
