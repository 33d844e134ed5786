-- Corral schema v4: governed agents. Runtime budgets per job; one AgentEvent per agent
-- attempt; checkpoints at tool-call boundaries; one policy evaluation per decision
-- (append-only).
ALTER TABLE jobs ADD COLUMN max_tool_calls INTEGER NOT NULL DEFAULT 50;
ALTER TABLE jobs ADD COLUMN token_budget_in INTEGER NOT NULL DEFAULT 100000;
ALTER TABLE jobs ADD COLUMN token_budget_out INTEGER NOT NULL DEFAULT 10000;

CREATE TABLE agent_events (
    event_id   TEXT PRIMARY KEY,
    job_id     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    at         REAL NOT NULL,
    session_id TEXT,
    tokens_in  INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    cost_usd   REAL,
    limit_hit  TEXT,
    data       TEXT NOT NULL,
    UNIQUE (job_id, attempt)
);

CREATE TABLE checkpoints (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id             TEXT NOT NULL,
    attempt            INTEGER NOT NULL,
    at                 REAL NOT NULL,
    worker             TEXT NOT NULL,
    session_id         TEXT,
    tool_call_count    INTEGER NOT NULL,
    last_tool          TEXT,
    last_output_digest TEXT,
    call_id            TEXT,
    duration_ms        INTEGER
);
CREATE INDEX checkpoints_by_job ON checkpoints (job_id, id);

CREATE TABLE policy_evaluations (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    job_id  TEXT NOT NULL,
    attempt INTEGER,
    stage   TEXT NOT NULL,
    subject TEXT NOT NULL,
    verdict TEXT NOT NULL,
    reason  TEXT NOT NULL,
    message TEXT NOT NULL,
    inputs  TEXT NOT NULL
);
CREATE INDEX policy_evaluations_by_job ON policy_evaluations (job_id, attempt, id);
