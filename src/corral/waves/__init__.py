"""Epics run as waves of fresh agents: the epic file and the pure rules of
the FIRE loop (Find, Ignite, Reap, Escalate). No I/O; services/epics.py runs the loop."""
