-- Corral schema v16: what a metrics scrape aggregates (store/metrics_sql.py) without a join or
-- a table scan per scrape. Each attempt carries its job's role and submit time (written with the
-- attempt, never changed), so the attempt histograms read one covering index; the jobs' figures
-- read another in GROUP BY order.
ALTER TABLE attempts ADD COLUMN role TEXT;
ALTER TABLE attempts ADD COLUMN submitted_at REAL;
UPDATE attempts SET role = (SELECT role FROM jobs WHERE jobs.id = attempts.job_id),
    submitted_at = (SELECT created_at FROM jobs WHERE jobs.id = attempts.job_id);
CREATE INDEX attempts_metrics ON attempts (role, idx, started_at, ended_at, submitted_at);
CREATE INDEX jobs_metrics ON jobs (role, env_name, priority, state, dlq_resolution);
