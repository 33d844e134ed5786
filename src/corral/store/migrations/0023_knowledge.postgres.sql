-- Corral schema v23 for PostgreSQL: the knowledge flywheel (see 0023_knowledge.sql); full-text
-- search over a generated tsvector column with a GIN index.
CREATE TABLE learnings (
    seq            BIGSERIAL PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE,
    tenant         TEXT NOT NULL,
    role           TEXT NOT NULL,
    kind           TEXT NOT NULL,
    title          TEXT NOT NULL,
    body           TEXT NOT NULL,
    digest         TEXT NOT NULL,
    score          DOUBLE PRECISION NOT NULL,
    tier           TEXT NOT NULL,
    confidence     DOUBLE PRECISION NOT NULL,
    utility        DOUBLE PRECISION NOT NULL,
    maturity       TEXT NOT NULL,
    status         TEXT NOT NULL,
    job_id         TEXT,
    attempt        INTEGER,
    git_commit     TEXT,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    reward_count   INTEGER NOT NULL DEFAULT 0,
    helpful_count  INTEGER NOT NULL DEFAULT 0,
    harmful_count  INTEGER NOT NULL DEFAULT 0,
    last_reward_at DOUBLE PRECISION,
    citations      INTEGER NOT NULL DEFAULT 0,
    UNIQUE (tenant, role, digest)
);
CREATE INDEX learnings_by_scope ON learnings (tenant, role, status);
CREATE TABLE learning_events (
    seq               BIGSERIAL PRIMARY KEY,
    learning_id       TEXT NOT NULL,
    at                DOUBLE PRECISION NOT NULL,
    action            TEXT NOT NULL,
    actor             TEXT NOT NULL,
    reason            TEXT NOT NULL,
    job_id            TEXT,
    utility_before    DOUBLE PRECISION,
    utility_after     DOUBLE PRECISION,
    confidence_before DOUBLE PRECISION,
    confidence_after  DOUBLE PRECISION,
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
    at          DOUBLE PRECISION NOT NULL,
    rank        INTEGER NOT NULL,
    score       DOUBLE PRECISION NOT NULL,
    reward      DOUBLE PRECISION,
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
    started_at DOUBLE PRECISION NOT NULL,
    succeeded  INTEGER,
    tool_calls INTEGER
);
CREATE INDEX knowledge_runs_by_role ON knowledge_runs (role, arm);
ALTER TABLE learnings ADD COLUMN search tsvector GENERATED ALWAYS AS (to_tsvector('english', title || ' ' || body)) STORED;
CREATE INDEX learnings_search ON learnings USING GIN (search);
CREATE TRIGGER learning_events_append_only BEFORE UPDATE OR DELETE ON learning_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER learning_events_no_truncate BEFORE TRUNCATE ON learning_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
