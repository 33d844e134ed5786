"""Mechanism: permits, budgets, worker delegation, cancellation: what no policy can break."""
