-- Corral schema v16: what a metrics scrape aggregates (store/metrics_sql.py) without a join or
-- a scan of every attempt per scrape. Each attempt carries its job's role and submit time
-- (written with the attempt, never changed). A scrape folds each attempt that ended (folded = 1)
-- into metric_rollups, the running sums of its histograms and counts, in one transaction; a
-- scrape reads the rollups plus the attempts not folded yet (the live ones).
ALTER TABLE attempts ADD COLUMN role TEXT;
ALTER TABLE attempts ADD COLUMN submitted_at REAL;
ALTER TABLE attempts ADD COLUMN folded INTEGER NOT NULL DEFAULT 0;
UPDATE attempts SET role = (SELECT role FROM jobs WHERE jobs.id = attempts.job_id),
    submitted_at = (SELECT created_at FROM jobs WHERE jobs.id = attempts.job_id);
CREATE INDEX attempts_unfolded ON attempts (folded, ended_at) WHERE folded = 0;
CREATE INDEX jobs_metrics ON jobs (role, env_name, priority, state, dlq_resolution);
CREATE TABLE metric_rollups (
    series TEXT NOT NULL,
    role   TEXT NOT NULL,
    le     REAL NOT NULL,
    n      INTEGER NOT NULL,
    total  REAL NOT NULL,
    PRIMARY KEY (series, role, le)
);
