"""Cancellation down the execution topology: what stopping a job means for the jobs it submitted.

A job submitted from inside another records its parent. When the parent is stopped — cancelled,
killed, denied, superseded by a latest-wins submission — or times out, every job it submitted
that has not ended is stopped too, in the same transaction, with the reason recorded on each
(and so on down to the grandchildren). A parent that ends any other way (succeeded, failed,
dead-lettered) leaves its children running: they are work it handed on. A child of a role with
`detached: true` is never stopped by its parent. While a parent is being stopped it cannot
submit new children (the store refuses them). Both stores use these rules
(tests/contract/test_store_contract.py, tests/acceptance/test_cancel_tree.py).
"""

from __future__ import annotations

from corral.domain.models import Job
from corral.domain.states import JobState

# How a parent's end reaches its children: the stop kind each child gets.
_CASCADE = {
    JobState.CANCELLED: "cancel",
    JobState.KILLED: "kill",
    JobState.DENIED: "cancel",
    JobState.TIMED_OUT: "cancel",
}
_VERB = {"cancel": "was cancelled", "kill": "was killed", "deny": "was denied"}


def reaches(child: Job) -> bool:
    """Whether a parent's stop reaches this child: it has not ended and is not detached."""
    return not child.state.terminal and not child.options.detached


def on_stop(parent: Job, kind: str, reason: str) -> tuple[str, str]:
    """(reason, kind) of the stop a child gets when its parent is stopped with `kind`."""
    verb = _VERB.get(kind, "was stopped")
    return f"parent {parent.id} {verb}: {reason}", "kill" if kind == "kill" else "cancel"


def on_end(parent: Job, ended: JobState, message: str) -> tuple[str, str] | None:
    """(reason, kind) of the stop a child gets when its parent ends as `ended`; None: it runs on.
    A stopped parent's children were reached when the stop was requested; this is for the
    ends that come without one (a timeout) and for stops of jobs that had not started."""
    kind = _CASCADE.get(ended)
    if kind is None:
        return None
    if ended is JobState.TIMED_OUT:
        return f"parent {parent.id} timed out: {message}", kind
    return on_stop(parent, parent.stop_kind or kind, parent.cancel_requested or message)


def refuses_children(parent: Job) -> str | None:
    """Why a job may not submit children now (it is being stopped, or was), else None."""
    if parent.state in _CASCADE:
        return f"parent {parent.id} ended {parent.state.value}"
    if parent.cancel_requested is not None:
        return f"parent {parent.id} is being stopped ({parent.cancel_requested})"
    return None
