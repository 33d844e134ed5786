-- Corral schema v32 (SQLite): how many jobs wait to run in each environment, kept by triggers
-- in the transaction of every change to a job's state. A submission checked the queue bounds
-- by counting the waiting jobs up to the bound: 0.26 ms a submission with 100 waiting, 0.78 ms
-- with 10,000 and 3.6 ms with 50,000 (a raised bound). It now reads one row per environment.
-- PostgreSQL keeps counting (migrations/0032_queue_depth.postgres.sql).
CREATE TABLE queue_depth (env_name TEXT PRIMARY KEY, waiting INTEGER NOT NULL);
INSERT INTO queue_depth (env_name, waiting) SELECT env_name, COUNT(*) FROM jobs WHERE state IN ('QUEUED', 'RETRY_WAIT') GROUP BY env_name;
CREATE TRIGGER queue_depth_insert AFTER INSERT ON jobs WHEN NEW.state IN ('QUEUED', 'RETRY_WAIT') BEGIN INSERT INTO queue_depth (env_name, waiting) VALUES (NEW.env_name, 1) ON CONFLICT (env_name) DO UPDATE SET waiting = waiting + 1; END;
CREATE TRIGGER queue_depth_leave AFTER UPDATE OF state, env_name ON jobs WHEN OLD.state IN ('QUEUED', 'RETRY_WAIT') BEGIN UPDATE queue_depth SET waiting = waiting - 1 WHERE env_name = OLD.env_name; END;
CREATE TRIGGER queue_depth_enter AFTER UPDATE OF state, env_name ON jobs WHEN NEW.state IN ('QUEUED', 'RETRY_WAIT') BEGIN INSERT INTO queue_depth (env_name, waiting) VALUES (NEW.env_name, 1) ON CONFLICT (env_name) DO UPDATE SET waiting = waiting + 1; END;
CREATE TRIGGER queue_depth_delete AFTER DELETE ON jobs WHEN OLD.state IN ('QUEUED', 'RETRY_WAIT') BEGIN UPDATE queue_depth SET waiting = waiting - 1 WHERE env_name = OLD.env_name; END;
