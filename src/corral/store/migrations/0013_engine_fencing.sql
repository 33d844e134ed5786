-- Corral schema v13: an engine declared dead by a peer that took its attempts over is
-- fenced. Its heart-beat is refused from then on, so an engine that was only paused notices it
-- lost its attempts; every write of an attempt's state names the engine that owns the attempt
-- (attempts.engine_id, changed by each takeover), so the paused engine cannot overwrite its
-- successor's.
ALTER TABLE engines ADD COLUMN fenced_at REAL;
