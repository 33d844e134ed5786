-- Corral schema v22: epics run as waves of fresh agents (services/epics.py, corral.waves): the
-- epic with its parsed file, each task's progress (tries, consecutive failures, the current
-- try's jobs, its commit on the epic branch), and one checkpoint row per wave.
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
