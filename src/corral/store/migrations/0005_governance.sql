-- Corral schema v5: governance. Run reports, incidents, kill switches and
-- pauses, budget ceilings and reservations, dark launches and approvals, all append-only and
-- hash-chained (store/chain.py); policy evaluations join their chain. The append-only triggers
-- come with 0006, after store/migrate.py has put existing policy evaluations on the chain.
ALTER TABLE policy_evaluations ADD COLUMN seq INTEGER;
ALTER TABLE policy_evaluations ADD COLUMN prev_hash TEXT;
ALTER TABLE policy_evaluations ADD COLUMN hash TEXT;
CREATE UNIQUE INDEX policy_evaluations_chain ON policy_evaluations (seq);

-- Each chain's tip (store/chain.py): appends take it with an UPDATE, which serialises them.
CREATE TABLE audit_heads (
    chain TEXT PRIMARY KEY,
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
);

-- One immutable report per job, written when it reaches a terminal state.
CREATE TABLE run_reports (
    id          TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL UNIQUE,
    job_id      TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    workflow    TEXT,
    outcome     TEXT NOT NULL,
    attempts    INTEGER NOT NULL,
    steps       INTEGER NOT NULL,
    tool_calls  INTEGER NOT NULL,
    tokens_in   INTEGER NOT NULL,
    tokens_out  INTEGER NOT NULL,
    cost_usd    REAL NOT NULL,
    started_at  REAL,
    ended_at    REAL NOT NULL,
    duration_ms INTEGER,
    summary     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    metrics     TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);

-- Incidents; a resolution is another row naming the incident it resolves (once).
CREATE TABLE incidents (
    id         TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL UNIQUE,
    report_id  TEXT,
    job_id     TEXT NOT NULL,
    type       TEXT NOT NULL,
    severity   TEXT NOT NULL,
    message    TEXT NOT NULL,
    created_at REAL NOT NULL,
    context    TEXT NOT NULL,
    resolves   TEXT UNIQUE,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX incidents_by_job ON incidents (job_id, seq);

-- Kill switches and pauses: an activation row, and a lift row when lifted (kind, action).
CREATE TABLE switch_events (
    seq        INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    switch_id  TEXT NOT NULL,
    action     TEXT NOT NULL,
    scope      TEXT NOT NULL,
    target     TEXT,
    reason     TEXT NOT NULL,
    at         REAL NOT NULL,
    actor      TEXT NOT NULL,
    expires_at REAL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    UNIQUE (kind, switch_id, action)
);

-- Budget ceilings per (scope, target): the latest row wins, earlier ones are the history.
CREATE TABLE budget_ceilings (
    seq         INTEGER PRIMARY KEY,
    scope       TEXT NOT NULL,
    target      TEXT NOT NULL,
    period      TEXT NOT NULL,
    ceiling_usd REAL NOT NULL,
    at          REAL NOT NULL,
    actor       TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);
CREATE INDEX budget_ceilings_by_target ON budget_ceilings (scope, target, seq);

-- Budget reservations and their settlement (a commit row `settles` one reserve row, once);
-- spend counts in the window that contains charged_at (the reservation's time).
CREATE TABLE budget_ledger (
    seq        INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    scope      TEXT NOT NULL,
    target     TEXT NOT NULL,
    amount     REAL NOT NULL,
    charged_at REAL NOT NULL,
    at         REAL NOT NULL,
    settles    INTEGER UNIQUE,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX budget_ledger_by_target ON budget_ledger (scope, target, charged_at);
CREATE INDEX budget_ledger_by_job ON budget_ledger (job_id);

-- Dark launches per workflow: the latest row wins.
CREATE TABLE dark_launches (
    seq        INTEGER PRIMARY KEY,
    workflow   TEXT NOT NULL,
    percentage INTEGER NOT NULL,
    enabled    INTEGER NOT NULL,
    at         REAL NOT NULL,
    actor      TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX dark_launches_by_workflow ON dark_launches (workflow, seq);

-- Approvals as events: the request (pending), then at most one decision or expiry; the
-- latest row is the approval's state.
CREATE TABLE approval_events (
    seq          INTEGER PRIMARY KEY,
    approval_id  TEXT NOT NULL,
    job_id       TEXT NOT NULL,
    subject      TEXT NOT NULL,
    digest       TEXT NOT NULL,
    reason       TEXT NOT NULL,
    requested_at REAL NOT NULL,
    expires_at   REAL NOT NULL,
    state        TEXT NOT NULL,
    at           REAL NOT NULL,
    actor        TEXT,
    note         TEXT NOT NULL,
    prev_hash    TEXT NOT NULL,
    hash         TEXT NOT NULL,
    UNIQUE (approval_id, state)
);
CREATE INDEX approval_events_by_job ON approval_events (job_id, seq);

-- The unified read model: a job, its report, its incidents (resolutions not counted)
-- and its latest policy verdict.
CREATE VIEW v_run_unified AS
SELECT j.id AS job_id, j.state AS state, j.role AS role, j.tenant AS tenant,
       j.worker AS worker, j.created_at AS created_at, j.updated_at AS updated_at,
       r.id AS report_id, r.outcome AS outcome, r.workflow AS workflow,
       r.cost_usd AS cost_usd, r.tokens_in AS tokens_in, r.tokens_out AS tokens_out,
       r.started_at AS started_at, r.ended_at AS ended_at, r.duration_ms AS duration_ms,
       (SELECT COUNT(*) FROM incidents i
         WHERE i.job_id = j.id AND i.resolves IS NULL) AS incidents_total,
       (SELECT COUNT(*) FROM incidents i
         WHERE i.job_id = j.id AND i.resolves IS NULL
           AND NOT EXISTS (SELECT 1 FROM incidents x WHERE x.resolves = i.id)) AS incidents_open,
       p.verdict AS policy_verdict, p.reason AS policy_reason, p.stage AS policy_stage,
       p.at AS policy_at
  FROM jobs j
  LEFT JOIN run_reports r ON r.job_id = j.id
  LEFT JOIN policy_evaluations p
    ON p.id = (SELECT MAX(q.id) FROM policy_evaluations q WHERE q.job_id = j.id);
