-- Corral schema v9: a job's children, found by their parent, so that cancelling a parent reaches
-- every job it submitted without scanning the table.
CREATE INDEX jobs_by_parent ON jobs (parent_id) WHERE parent_id IS NOT NULL;
