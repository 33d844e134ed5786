-- Corral schema v30: the waiting jobs that take part in the world model's edges (a parent, or
-- dependencies not met yet). The world watch reads them every second while anything runs; with
-- 100,000 jobs queued that read scanned the whole table (bench/scenarios.py Q100K).
CREATE INDEX jobs_linked ON jobs (state) WHERE parent_id IS NOT NULL OR deps_pending > 0;
