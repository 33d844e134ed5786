"""Queue order: priority with aging, FIFO within a priority, no starvation."""

from __future__ import annotations


def sort_key(enqueued_at: float, priority: int, aging_s: float) -> float:
    """A job of priority p is ordered as if it had arrived p × aging_s later.

    Within one priority this is FIFO; across priorities a backlog job (4) is overtaken only by
    work that arrived less than 4 × aging_s after it, so it cannot starve (docs/explanation).
    """
    return enqueued_at + priority * aging_s
