-- Corral schema v18: a tenant's jobs listed by the store itself, newest first, a page at a time
-- (the HTTP API's job list: services/tenancy.py), and token creations and revocations on an
-- audit chain of their own (who made or revoked which token, for which tenant and scopes; never
-- the token nor its hash), append-only like the governance tables (SQLite; PostgreSQL has
-- 0018_tenant_jobs_token_events.postgres.sql).
CREATE INDEX jobs_by_tenant ON jobs (tenant, id);
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
CREATE TRIGGER token_events_no_update BEFORE UPDATE ON token_events BEGIN SELECT RAISE(ABORT, 'token_events is append-only'); END;
CREATE TRIGGER token_events_no_delete BEFORE DELETE ON token_events BEGIN SELECT RAISE(ABORT, 'token_events is append-only'); END;
