-- Corral current schema: what a fresh database is created with (store/migrate.py translates it for PostgreSQL).
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
);
CREATE INDEX jobs_runnable ON jobs (sort_at, id) WHERE state = 'QUEUED' AND deps_pending = 0;
CREATE INDEX jobs_by_state ON jobs (state, id);
CREATE INDEX jobs_retry ON jobs (retry_at) WHERE state = 'RETRY_WAIT';
CREATE INDEX jobs_waiting ON jobs (env_name) WHERE state IN ('QUEUED', 'RETRY_WAIT');
CREATE INDEX jobs_by_workspace ON jobs (workspace, state, sort_at, id) WHERE workspace IS NOT NULL;

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
    limit_hit   TEXT,
    UNIQUE (job_id, idx)
);
CREATE INDEX attempts_live ON attempts (state) WHERE state IN ('STARTING', 'RUNNING');
CREATE INDEX attempts_by_created ON attempts (created_at);

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
);
CREATE INDEX job_events_by_job ON job_events (job_id, id);

CREATE TABLE engines (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
);

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
