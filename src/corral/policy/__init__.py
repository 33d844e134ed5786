"""Policy checks that decide, before anything runs, whether an agent's request is in scope."""
