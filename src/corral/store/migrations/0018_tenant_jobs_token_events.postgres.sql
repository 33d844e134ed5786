-- Corral schema v18 for PostgreSQL: a tenant's jobs listed by the store itself (services/tenancy.py),
-- and token creations and revocations on an audit chain of their own, append-only (never the
-- token nor its hash).
CREATE INDEX jobs_by_tenant ON jobs (tenant, id);
CREATE TABLE token_events (
    seq        INTEGER PRIMARY KEY,
    token_id   TEXT NOT NULL,
    action     TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    name       TEXT NOT NULL,
    at         DOUBLE PRECISION NOT NULL,
    actor      TEXT NOT NULL,
    expires_at DOUBLE PRECISION,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    UNIQUE (token_id, action)
);
CREATE TRIGGER token_events_append_only BEFORE UPDATE OR DELETE ON token_events FOR EACH ROW EXECUTE FUNCTION corral_append_only();
CREATE TRIGGER token_events_no_truncate BEFORE TRUNCATE ON token_events FOR EACH STATEMENT EXECUTE FUNCTION corral_append_only();
