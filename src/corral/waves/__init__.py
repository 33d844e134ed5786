"""Epics run as waves of fresh agents (the ratchet, docs/how-to/epics.md): the epic file and
the pure rules of the FIRE loop (Find, Ignite, Reap, Escalate). No I/O: services/waves.py runs
the loop."""
