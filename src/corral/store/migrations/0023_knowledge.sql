-- Corral schema v23: the knowledge flywheel (corral/knowledge, runtime/flywheel.py). Learnings,
-- scoped by tenant and role, with their provenance (job, attempt, commit) and maturity; the
-- append-only history of their score changes; the citations that say which attempt was given
-- which learning; each agent run's A/B arm. Full-text search: FTS5 here, a tsvector column in
-- PostgreSQL (0023_knowledge.postgres.sql). A learning's title and body never change (the FTS
-- index follows inserts only).
CREATE TABLE learnings (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE,
    tenant         TEXT NOT NULL,
    role           TEXT NOT NULL,
    kind           TEXT NOT NULL,
    title          TEXT NOT NULL,
    body           TEXT NOT NULL,
    digest         TEXT NOT NULL,
    score          REAL NOT NULL,
    tier           TEXT NOT NULL,
    confidence     REAL NOT NULL,
    utility        REAL NOT NULL,
    maturity       TEXT NOT NULL,
    status         TEXT NOT NULL,
    job_id         TEXT,
    attempt        INTEGER,
    git_commit     TEXT,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    reward_count   INTEGER NOT NULL DEFAULT 0,
    helpful_count  INTEGER NOT NULL DEFAULT 0,
    harmful_count  INTEGER NOT NULL DEFAULT 0,
    last_reward_at REAL,
    citations      INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant, role, digest)
);
CREATE INDEX learnings_by_scope ON learnings (tenant, role, status);
CREATE TABLE learning_events (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    learning_id       TEXT NOT NULL,
    at                REAL NOT NULL,
    action            TEXT NOT NULL,
    actor             TEXT NOT NULL,
    reason            TEXT NOT NULL,
    job_id            TEXT,
    utility_before    REAL,
    utility_after     REAL,
    confidence_before REAL,
    confidence_after  REAL,
    maturity_before   TEXT,
    maturity_after    TEXT,
    status_before     TEXT,
    status_after      TEXT
);
CREATE INDEX learning_events_by_learning ON learning_events (learning_id, seq);
CREATE TABLE knowledge_citations (
    learning_id TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    at          REAL NOT NULL,
    rank        INTEGER NOT NULL,
    score       REAL NOT NULL,
    reward      REAL,
    PRIMARY KEY (job_id, attempt, learning_id)
);
CREATE INDEX knowledge_citations_by_learning ON knowledge_citations (learning_id);
CREATE TABLE knowledge_runs (
    job_id     TEXT PRIMARY KEY,
    attempt    INTEGER NOT NULL,
    tenant     TEXT NOT NULL,
    role       TEXT NOT NULL,
    arm        TEXT NOT NULL,
    reason     TEXT NOT NULL,
    injected   INTEGER NOT NULL,
    started_at REAL NOT NULL,
    succeeded  INTEGER,
    tool_calls INTEGER
);
CREATE INDEX knowledge_runs_by_role ON knowledge_runs (role, arm);
CREATE VIRTUAL TABLE learnings_fts USING fts5(title, body, content='learnings', content_rowid='seq', tokenize='porter unicode61');
CREATE TRIGGER learnings_fts_insert AFTER INSERT ON learnings BEGIN INSERT INTO learnings_fts (rowid, title, body) VALUES (new.seq, new.title, new.body); END;
CREATE TRIGGER learnings_text_fixed BEFORE UPDATE OF title, body ON learnings BEGIN SELECT RAISE(ABORT, 'a learning''s title and body never change'); END;
CREATE TRIGGER learning_events_no_update BEFORE UPDATE ON learning_events BEGIN SELECT RAISE(ABORT, 'learning_events is append-only'); END;
CREATE TRIGGER learning_events_no_delete BEFORE DELETE ON learning_events BEGIN SELECT RAISE(ABORT, 'learning_events is append-only'); END;
