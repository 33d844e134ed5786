-- Corral current schema, SQLite only: appended to schema.sql by store/migrate.py.
-- The append-only tables refuse UPDATE and DELETE (SQLite): changing history takes dropping a
-- trigger, and then the hash chain shows it (corral audit verify).
CREATE TRIGGER policy_evaluations_no_update BEFORE UPDATE ON policy_evaluations BEGIN SELECT RAISE(ABORT, 'policy_evaluations is append-only'); END;
CREATE TRIGGER policy_evaluations_no_delete BEFORE DELETE ON policy_evaluations WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'policy_evaluations'), 0) BEGIN SELECT RAISE(ABORT, 'policy_evaluations is append-only'); END;
CREATE TRIGGER run_reports_no_update BEFORE UPDATE ON run_reports BEGIN SELECT RAISE(ABORT, 'run_reports is append-only'); END;
CREATE TRIGGER run_reports_no_delete BEFORE DELETE ON run_reports WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'run_reports'), 0) BEGIN SELECT RAISE(ABORT, 'run_reports is append-only'); END;
CREATE TRIGGER incidents_no_update BEFORE UPDATE ON incidents BEGIN SELECT RAISE(ABORT, 'incidents is append-only'); END;
CREATE TRIGGER incidents_no_delete BEFORE DELETE ON incidents WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'incidents'), 0) BEGIN SELECT RAISE(ABORT, 'incidents is append-only'); END;
CREATE TRIGGER switch_events_no_update BEFORE UPDATE ON switch_events BEGIN SELECT RAISE(ABORT, 'switch_events is append-only'); END;
CREATE TRIGGER switch_events_no_delete BEFORE DELETE ON switch_events BEGIN SELECT RAISE(ABORT, 'switch_events is append-only'); END;
CREATE TRIGGER budget_ceilings_no_update BEFORE UPDATE ON budget_ceilings BEGIN SELECT RAISE(ABORT, 'budget_ceilings is append-only'); END;
CREATE TRIGGER budget_ceilings_no_delete BEFORE DELETE ON budget_ceilings BEGIN SELECT RAISE(ABORT, 'budget_ceilings is append-only'); END;
CREATE TRIGGER budget_ledger_no_update BEFORE UPDATE ON budget_ledger BEGIN SELECT RAISE(ABORT, 'budget_ledger is append-only'); END;
CREATE TRIGGER budget_ledger_no_delete BEFORE DELETE ON budget_ledger BEGIN SELECT RAISE(ABORT, 'budget_ledger is append-only'); END;
CREATE TRIGGER dark_launches_no_update BEFORE UPDATE ON dark_launches BEGIN SELECT RAISE(ABORT, 'dark_launches is append-only'); END;
CREATE TRIGGER dark_launches_no_delete BEFORE DELETE ON dark_launches BEGIN SELECT RAISE(ABORT, 'dark_launches is append-only'); END;
CREATE TRIGGER approval_events_no_update BEFORE UPDATE ON approval_events BEGIN SELECT RAISE(ABORT, 'approval_events is append-only'); END;
CREATE TRIGGER approval_events_no_delete BEFORE DELETE ON approval_events WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'approval_events'), 0) BEGIN SELECT RAISE(ABORT, 'approval_events is append-only'); END;
CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events WHEN OLD.seq IS NULL OR OLD.seq > COALESCE((SELECT seq FROM archive_heads WHERE chain = 'job_events'), 0) BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TRIGGER token_events_no_update BEFORE UPDATE ON token_events BEGIN SELECT RAISE(ABORT, 'token_events is append-only'); END;
CREATE TRIGGER token_events_no_delete BEFORE DELETE ON token_events BEGIN SELECT RAISE(ABORT, 'token_events is append-only'); END;
-- migration 0023: the learnings' full-text index (FTS5), their fixed text, their append-only history
CREATE VIRTUAL TABLE learnings_fts USING fts5(title, body, content='learnings', content_rowid='seq', tokenize='porter unicode61');
CREATE TRIGGER learnings_fts_insert AFTER INSERT ON learnings BEGIN INSERT INTO learnings_fts (rowid, title, body) VALUES (new.seq, new.title, new.body); END;
CREATE TRIGGER learnings_text_fixed BEFORE UPDATE OF title, body ON learnings BEGIN SELECT RAISE(ABORT, 'a learning''s title and body never change'); END;
CREATE TRIGGER learning_events_no_update BEFORE UPDATE ON learning_events BEGIN SELECT RAISE(ABORT, 'learning_events is append-only'); END;
CREATE TRIGGER learning_events_no_delete BEFORE DELETE ON learning_events BEGIN SELECT RAISE(ABORT, 'learning_events is append-only'); END;
-- v28: the text search of a tenant's jobs reads the expression it compares from this index
-- (migrations/0028_jobs_text.sql; not on PostgreSQL, whose index entries are size-limited).
CREATE INDEX jobs_text ON jobs (tenant, id, LOWER(command || ' ' || COALESCE(prompt, '')));
-- v32: the number of jobs waiting to run in each environment, kept by triggers (the queue
-- bounds read it instead of counting: migrations/0032_queue_depth.sql).
CREATE TABLE queue_depth (env_name TEXT PRIMARY KEY, waiting INTEGER NOT NULL);
CREATE TRIGGER queue_depth_insert AFTER INSERT ON jobs WHEN NEW.state IN ('QUEUED', 'RETRY_WAIT') BEGIN INSERT INTO queue_depth (env_name, waiting) VALUES (NEW.env_name, 1) ON CONFLICT (env_name) DO UPDATE SET waiting = waiting + 1; END;
CREATE TRIGGER queue_depth_leave AFTER UPDATE OF state, env_name ON jobs WHEN OLD.state IN ('QUEUED', 'RETRY_WAIT') BEGIN UPDATE queue_depth SET waiting = waiting - 1 WHERE env_name = OLD.env_name; END;
CREATE TRIGGER queue_depth_enter AFTER UPDATE OF state, env_name ON jobs WHEN NEW.state IN ('QUEUED', 'RETRY_WAIT') BEGIN INSERT INTO queue_depth (env_name, waiting) VALUES (NEW.env_name, 1) ON CONFLICT (env_name) DO UPDATE SET waiting = waiting + 1; END;
CREATE TRIGGER queue_depth_delete AFTER DELETE ON jobs WHEN OLD.state IN ('QUEUED', 'RETRY_WAIT') BEGIN UPDATE queue_depth SET waiting = waiting - 1 WHERE env_name = OLD.env_name; END;
