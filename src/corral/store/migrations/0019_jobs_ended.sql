-- Corral schema v19: the jobs that ended, by the time they ended (their last change), for the
-- dashboard's throughput chart: "jobs ended in the last hour" reads this index, not every job.
-- A job enters it once, when it reaches a terminal state.
CREATE INDEX jobs_ended ON jobs (updated_at)
    WHERE state IN ('SUCCEEDED', 'FAILED', 'DEAD_LETTERED', 'TIMED_OUT', 'CANCELLED', 'KILLED', 'DENIED');
