-- Corral schema v10: the configuration each engine serves with, recorded when it
-- starts. Clients check submissions against the latest one and `corral config show` prints it.
-- Secret-looking values are redacted before they are written; rows are only ever added.
CREATE TABLE engine_configs (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    engine_id TEXT NOT NULL,
    at        REAL NOT NULL,
    hash      TEXT NOT NULL,
    source    TEXT,
    text      TEXT NOT NULL
);
