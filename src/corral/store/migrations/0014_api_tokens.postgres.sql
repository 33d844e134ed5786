-- Corral schema v14: bearer tokens of the HTTP API (src/corral/api/, domain/tokens.py). Only the
-- sha256 of a token's secret is kept; a token is revoked, never deleted, so the record of who
-- could call the API stays.
CREATE TABLE api_tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    created_by  TEXT NOT NULL,
    expires_at  DOUBLE PRECISION,
    revoked_at  DOUBLE PRECISION,
    revoked_by  TEXT
);
