-- Corral schema v2: submission backpressure and workspace locks.

-- Backpressure counts the jobs waiting to run (QUEUED or RETRY_WAIT), per environment.
CREATE INDEX jobs_waiting ON jobs (env_name) WHERE state IN ('QUEUED', 'RETRY_WAIT');
-- Who else is on a workspace: the active jobs naming it, in queue order.
CREATE INDEX jobs_by_workspace ON jobs (workspace, state, sort_at, id) WHERE workspace IS NOT NULL;
-- The recent start rate behind a refusal's retry-after estimate.
CREATE INDEX attempts_by_created ON attempts (created_at);

-- One row per held workspace: the job that may run on it (released when that job ends).
CREATE TABLE workspace_locks (
    workspace   TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    acquired_at REAL NOT NULL
);

-- Lock waits: since when a job found its workspace
-- held by another job, and when it finally took the lock.
CREATE TABLE workspace_waits (
    job_id      TEXT PRIMARY KEY,
    workspace   TEXT NOT NULL,
    since       REAL NOT NULL,
    acquired_at REAL
);
CREATE INDEX workspace_waits_by_acquired ON workspace_waits (acquired_at)
    WHERE acquired_at IS NOT NULL;

-- Jobs already started on a workspace before this version hold it from now on.
INSERT INTO workspace_locks (workspace, job_id, acquired_at)
    SELECT workspace, MIN(id), MIN(updated_at) FROM jobs
    WHERE workspace IS NOT NULL AND state IN ('STARTING', 'RUNNING', 'RETRY_WAIT')
    GROUP BY workspace;
