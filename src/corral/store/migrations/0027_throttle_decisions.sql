-- Corral schema v27: predictive throttling (corral.world.throttle) reads the latest throttle
-- decision of an environment at every submission to it: the few policy evaluations of stage
-- `throttle` get an index of their own (partial: tool-call evaluations do not pay for it).
CREATE INDEX policy_evaluations_throttle ON policy_evaluations (subject, id)
    WHERE stage = 'throttle';
