-- Corral schema v15: how far each event sink has published each outbox table
-- (docs/how-to/events.md). The outbox is the append-only tables themselves: a row's chain
-- position (`seq`, store/chain.py) is handed out under the chain's head lock, so rows commit in
-- `seq` order and a cursor past `last_id` never skips a row that commits later. `skipped` counts
-- the rows the cursor jumped over when the backlog passed `events.max_backlog`; `holder` and
-- `lease_until` name the one engine that drains the sink (a lease taken by compare-and-set).
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
