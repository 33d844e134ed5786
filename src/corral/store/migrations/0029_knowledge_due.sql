-- Corral schema v29: the runs whose learnings are still to settle. The reporter marks an agent
-- run here before it writes the run's report and clears the mark once the flywheel has
-- rewarded the learnings the run was given and extracted what it teaches; an engine that dies
-- in between leaves the mark, and the next look of any engine settles the run (every step is
-- idempotent), so a crash there no longer loses a reward, an A/B outcome or a learning.
CREATE TABLE knowledge_due (
    job_id TEXT PRIMARY KEY,
    due_at REAL NOT NULL
);
CREATE INDEX knowledge_due_by_time ON knowledge_due (due_at);
