-- Corral schema v3: the core's decisions, recorded (breaker transitions, defense stages,
-- escalations opened and cleared). Append-only.
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
