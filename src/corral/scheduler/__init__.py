"""Policy: queue order and fairness, retries and the dead-letter queue, dedup, submission rules."""
