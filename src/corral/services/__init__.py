"""Application services: what every edge (the `corral` command, the HTTP API and the dashboard)
calls with plain typed arguments, getting domain values and read models back.

An edge parses its input, calls one service, renders the answer and maps errors to its own
codes; it holds no business logic. A service takes the store (`core/ports.py`) and whatever
else it needs as parameters — the configuration, a clock, who acts, a `wake` callable that tells
a running engine to look now — so it imports no edge (import-linter contracts in
pyproject.toml). It sits above runtime/ (it composes the pre-run gate, the published
configuration and the audit check from there) and below the edges.
"""

from __future__ import annotations

from collections.abc import Callable

# Tell a running engine to look now (`op`: "wake", "submitted"): its answer, None when no engine
# answered (then the engine finds the change on its next periodic look).
Wake = Callable[[str], object | None]
# A note for the operator on the way (the edge decides whether and where to show it).
Notify = Callable[[str], None]
