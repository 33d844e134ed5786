"""Mechanism: permits and budgets, worker delegation and cancellation. Invariants no policy can break."""
