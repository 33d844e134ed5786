-- Corral current schema: what a fresh database is created with (store/migrate.py translates it for
-- PostgreSQL and appends schema.<dialect>.sql: the triggers).
CREATE TABLE jobs (
    id               TEXT PRIMARY KEY,
    state            TEXT NOT NULL,
    role             TEXT NOT NULL,
    worker           TEXT NOT NULL,
    env_name         TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    tenant           TEXT NOT NULL,
    command          TEXT NOT NULL,
    prompt           TEXT,
    cwd              TEXT,
    env              TEXT NOT NULL,
    options          TEXT NOT NULL,
    max_attempts     INTEGER NOT NULL,
    timeout_s        REAL NOT NULL,
    grace_s          REAL NOT NULL,
    idem_key         TEXT,
    dedup            TEXT NOT NULL,
    workspace        TEXT,
    parent_id        TEXT,
    depth            INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    sort_at          REAL NOT NULL,
    retry_at         REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    deps_pending     INTEGER NOT NULL DEFAULT 0,
    after_ids        TEXT NOT NULL,
    last_error       TEXT,
    exit_code        INTEGER,
    limit_hit        TEXT,
    cancel_requested TEXT,
    stop_kind        TEXT,
    requeued_from    TEXT,
    dlq_resolution   TEXT,
    lease_owner      TEXT,
    lease_until      REAL
    -- appended by migrations 0004 and 0031 (SQLite keeps ALTER TABLE's text verbatim)
, max_tool_calls INTEGER NOT NULL DEFAULT 50, token_budget_in INTEGER NOT NULL DEFAULT 100000, token_budget_out INTEGER NOT NULL DEFAULT 10000, reported INTEGER NOT NULL DEFAULT 0);
CREATE INDEX jobs_runnable ON jobs (sort_at, id) WHERE state = 'QUEUED' AND deps_pending = 0;
CREATE INDEX jobs_by_state ON jobs (state, id);
CREATE INDEX jobs_retry ON jobs (retry_at) WHERE state = 'RETRY_WAIT';
CREATE INDEX jobs_waiting ON jobs (env_name) WHERE state IN ('QUEUED', 'RETRY_WAIT');
CREATE INDEX jobs_by_workspace ON jobs (workspace, state, sort_at, id) WHERE workspace IS NOT NULL;
CREATE INDEX jobs_by_parent ON jobs (parent_id) WHERE parent_id IS NOT NULL;
-- waiting jobs in the world model's edges (world_sql.py world_jobs; migration 0030)
CREATE INDEX jobs_linked ON jobs (state) WHERE parent_id IS NOT NULL OR deps_pending > 0;
-- terminal jobs waiting for their run report (governance_sql.py unreported; migration 0031)
CREATE INDEX jobs_unreported ON jobs (updated_at, id) WHERE reported = 0 AND state IN ('CANCELLED', 'DEAD_LETTERED', 'DENIED', 'FAILED', 'KILLED', 'SUCCEEDED', 'TIMED_OUT');
CREATE INDEX jobs_metrics ON jobs (role, env_name, priority, state, dlq_resolution);
CREATE INDEX jobs_by_tenant ON jobs (tenant, id);
CREATE INDEX jobs_ended ON jobs (updated_at)
    WHERE state IN ('SUCCEEDED', 'FAILED', 'DEAD_LETTERED', 'TIMED_OUT', 'CANCELLED', 'KILLED', 'DENIED');

CREATE TABLE job_deps (
    job_id TEXT NOT NULL,
    dep_id TEXT NOT NULL,
    PRIMARY KEY (job_id, dep_id)
);
CREATE INDEX job_deps_by_dep ON job_deps (dep_id);

CREATE TABLE idem_keys (
    idem_key    TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    acquired_at REAL NOT NULL
);

CREATE TABLE attempts (
    id          TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    state       TEXT NOT NULL,
    permit_id   TEXT NOT NULL UNIQUE,
    permit      TEXT NOT NULL,
    deadline_at REAL NOT NULL,
    created_at  REAL NOT NULL,
    dir         TEXT NOT NULL,
    engine_id   TEXT NOT NULL,
    pid         INTEGER,
    started_at  REAL,
    ended_at    REAL,
    exit_code   INTEGER,
    signal      INTEGER,
    outcome     TEXT,
    error       TEXT,
    limit_hit   TEXT, role TEXT, submitted_at REAL, folded INTEGER NOT NULL DEFAULT 0,
    -- role, submitted_at, folded: added by migration 0016 (the metrics' rollups)
    UNIQUE (job_id, idx)
);
CREATE INDEX attempts_live ON attempts (state) WHERE state IN ('STARTING', 'RUNNING');
CREATE INDEX attempts_by_created ON attempts (created_at);
CREATE INDEX attempts_unfolded ON attempts (folded, ended_at) WHERE folded = 0;

-- The settled attempts' histograms and counts, per series (run, wait, attempt), role and bucket
-- upper bound `le` (store/metrics_sql.py folds attempts into it at scrape time).
CREATE TABLE metric_rollups (
    series TEXT NOT NULL,
    role   TEXT NOT NULL,
    le     REAL NOT NULL,
    n      INTEGER NOT NULL,
    total  REAL NOT NULL,
    PRIMARY KEY (series, role, le)
);

-- The anomaly detector's rolling baselines (corral.world.anomaly): per role, job kind and metric
-- the latest finished attempts' values, a JSON array, oldest first.
CREATE TABLE world_baselines (
    role       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    metric     TEXT NOT NULL,
    samples    TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (role, kind, metric)
);

-- Epics run as waves (migration 0022, services/epics.py): the epic with its parsed file, each
-- task's progress, and one checkpoint row per wave.
CREATE TABLE epics (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    repo             TEXT NOT NULL,
    base             TEXT NOT NULL,
    branch           TEXT NOT NULL,
    spec             TEXT NOT NULL,
    state            TEXT NOT NULL,
    wave             INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    cancel_requested TEXT,
    reason           TEXT
);
CREATE INDEX epics_by_state ON epics (state, id);
CREATE TABLE epic_tasks (
    epic_id    TEXT NOT NULL,
    task_id    TEXT NOT NULL,
    position   INTEGER NOT NULL,
    state      TEXT NOT NULL,
    attempts   INTEGER NOT NULL,
    failures   INTEGER NOT NULL,
    job_id     TEXT,
    judges     TEXT NOT NULL,
    commit_sha TEXT,
    verdict    TEXT,
    updated_at REAL NOT NULL,
    PRIMARY KEY (epic_id, task_id)
);
CREATE TABLE epic_waves (
    epic_id    TEXT NOT NULL,
    wave       INTEGER NOT NULL,
    started_at REAL NOT NULL,
    tasks      TEXT NOT NULL,
    ended_at   REAL,
    results    TEXT,
    head       TEXT,
    PRIMARY KEY (epic_id, wave)
);

CREATE TABLE job_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     TEXT NOT NULL,
    at         REAL NOT NULL,
    kind       TEXT NOT NULL,
    from_state TEXT,
    to_state   TEXT,
    attempt    INTEGER,
    message    TEXT NOT NULL,
    data       TEXT NOT NULL
    -- appended by migration 0012: the timeline's audit chain (store/chain.py)
, seq INTEGER, prev_hash TEXT, hash TEXT);
CREATE INDEX job_events_by_job ON job_events (job_id, id);
CREATE UNIQUE INDEX job_events_chain ON job_events (seq);

CREATE TABLE engines (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
    -- appended by migration 0013: when a peer declared it dead and took its attempts over
, fenced_at REAL);

-- The job that may run on a workspace, until it ends (store/sql.py: workspace locks).
CREATE TABLE workspace_locks (
    workspace   TEXT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    acquired_at REAL NOT NULL
);

CREATE TABLE workspace_waits (
    job_id      TEXT PRIMARY KEY,
    workspace   TEXT NOT NULL,
    since       REAL NOT NULL,
    acquired_at REAL
);
CREATE INDEX workspace_waits_by_acquired ON workspace_waits (acquired_at)
    WHERE acquired_at IS NOT NULL;

CREATE TABLE core_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL NOT NULL,
    kind     TEXT NOT NULL,
    scope    TEXT NOT NULL,
    name     TEXT NOT NULL,
    state    TEXT NOT NULL,
    severity TEXT NOT NULL,
    reason   TEXT NOT NULL,
    message  TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX core_events_by_kind ON core_events (kind, id);

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
    -- appended by migration 0005: the audit chain (SQLite keeps ALTER TABLE's text verbatim)
, seq INTEGER, prev_hash TEXT, hash TEXT);
CREATE INDEX policy_evaluations_by_job ON policy_evaluations (job_id, attempt, id);
CREATE UNIQUE INDEX policy_evaluations_chain ON policy_evaluations (seq);
-- predictive throttling's latest decision per environment (corral.world.throttle)
CREATE INDEX policy_evaluations_throttle ON policy_evaluations (subject, id)
    WHERE stage = 'throttle';

-- Each chain's tip (store/chain.py): appends take it with an UPDATE, which serialises them.
-- keyed_from (migration 0012): the chain's first seq hashed with the key (NULL: none yet).
CREATE TABLE audit_heads (
    chain TEXT PRIMARY KEY,
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
    -- appended by migration 0012
, keyed_from INTEGER);

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

-- The configuration each engine serves with, recorded when it starts, redacted.
CREATE TABLE engine_configs (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    engine_id TEXT NOT NULL,
    at        REAL NOT NULL,
    hash      TEXT NOT NULL,
    source    TEXT,
    text      TEXT NOT NULL
);

-- Bearer tokens of the HTTP API: only the hash of each secret; revoked, never deleted.
CREATE TABLE api_tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  REAL NOT NULL,
    created_by  TEXT NOT NULL,
    expires_at  REAL,
    revoked_at  REAL,
    revoked_by  TEXT
);

-- Token creations and revocations, on an audit chain (never the token nor its hash).
CREATE TABLE token_events (
    seq        INTEGER PRIMARY KEY,
    token_id   TEXT NOT NULL,
    action     TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    name       TEXT NOT NULL,
    at         REAL NOT NULL,
    actor      TEXT NOT NULL,
    expires_at REAL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    UNIQUE (token_id, action)
);

-- How far each event sink has published each outbox table (migration 0015, trace/drain.py).
CREATE TABLE event_cursors (
    sink        TEXT NOT NULL,
    source      TEXT NOT NULL,
    last_id     INTEGER NOT NULL,
    skipped     INTEGER NOT NULL DEFAULT 0,
    holder      TEXT,
    lease_until REAL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (sink, source)
);

-- migration 0017: retention (services/retention.py)
CREATE TABLE archive_heads (
    chain TEXT PRIMARY KEY,
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
);

CREATE TABLE archives (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL NOT NULL,
    file     TEXT NOT NULL,
    jobs     INTEGER NOT NULL,
    segments TEXT NOT NULL
);

CREATE TABLE gc_lease (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    lease_until REAL NOT NULL
);

-- migration 0023: the knowledge flywheel (corral/knowledge; FTS in schema.<dialect>.sql)
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
-- the runs whose learnings are still to settle (runtime/flywheel.py; migration 0029)
CREATE TABLE knowledge_due (
    job_id TEXT PRIMARY KEY,
    due_at REAL NOT NULL
);
CREATE INDEX knowledge_due_by_time ON knowledge_due (due_at);
