-- Corral schema v21: the anomaly detector's rolling baselines (corral.world.anomaly). One row per
-- (role, job kind, metric): the latest finished attempts' values as a JSON array, oldest first.
CREATE TABLE world_baselines (
    role       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    metric     TEXT NOT NULL,
    samples    TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (role, kind, metric)
);
