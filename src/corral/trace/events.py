"""The committed records as events: which tables are published, under which subject and id
(docs/how-to/events.md). Pure: a row in, an event out; nothing here talks to a store or a broker.

Each event's id is `<table>:<seq>` — the row's chain position (store/chain.py), which is the same
on every engine and after every restart, so a broker (JetStream's `Nats-Msg-Id`) or a consumer
(Redis) can drop a second copy. An AgentEvent keeps its own `event_id`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from corral.domain.agents import AgentEvent

AGENT_SUBJECT = "mp.agent.events"
JOB_PREFIX = "corral.jobs"
GOVERNANCE_PREFIX = "corral.governance"
# Every subject a sink may carry: a JetStream stream is made to hold these.
SUBJECTS = (AGENT_SUBJECT, JOB_PREFIX + ".>", GOVERNANCE_PREFIX + ".>")

JOB_EVENTS = "job_events"
# The outbox tables, each with the kind its records are published under (corral.governance.<kind>)
GOVERNANCE: Mapping[str, str] = {
    "policy_evaluations": "policy_evaluation",
    "run_reports": "report",
    "incidents": "incident",
    "switch_events": "switch",  # refined by the row's own kind: kill_switch, pause
    "budget_ceilings": "budget_ceiling",
    "budget_ledger": "budget_ledger",
    "dark_launches": "dark_launch",
    "approval_events": "approval",
    "token_events": "token",  # an API token created or revoked: never its secret nor its hash
}
SOURCES: tuple[str, ...] = (JOB_EVENTS, *GOVERNANCE)
# Columns that hold JSON text in the tables: published as JSON values, not strings.
_JSON_COLUMNS = frozenset({"data", "inputs", "context", "metrics"})
# The job timeline kind after which the attempt's AgentEvent exists (written before it).
ATTEMPT_ENDED = "attempt_ended"


@dataclass(frozen=True)
class Event:
    """One record as published: its dedup id, subject (the Redis stream key too), and body."""

    event_id: str
    subject: str
    body: Mapping[str, Any]

    @functools.cached_property
    def _payload(self) -> bytes:  # once for every sink the event goes to (trace/drain.py)
        # orjson: a tenth of the json module's CPU, the largest part of a record's cost to the
        # engine's loop (bench/events.py --drainer)
        return orjson.dumps(self.body, option=_SORTED, default=_plain)

    def payload(self) -> bytes:
        """The body as the bytes a broker carries (JSON, keys sorted)."""
        return self._payload


_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _plain(value: Any) -> Any:
    """What orjson does not know how to write: a mapping as an object, anything else as text
    (a row's values are the store's: numbers, text, JSON; this is for what a driver adds)."""
    return dict(value) if isinstance(value, Mapping) else str(value)


@functools.lru_cache(maxsize=512)  # a few dozen states and kinds: built once each
def _token(text: str) -> str:
    """A subject token: lower case, nothing a NATS subject treats specially."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text.lower()) or "none"


def _value(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # not JSON after all: published as text
        return text


def _decoded(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with its JSON columns as values (only those: a row has a dozen columns)."""
    out = dict(row)
    for key in _JSON_COLUMNS.intersection(out):
        if isinstance(value := out[key], str):
            out[key] = _value(value)
    return out


def subject_of(source: str, row: Mapping[str, Any]) -> str:
    """`corral.jobs.<state>` for a job's change of state (`corral.jobs.event.<kind>` for a
    timeline line that changes none), `corral.governance.<kind>` for a governance record."""
    if source == JOB_EVENTS:
        to = row.get("to_state")
        return f"{JOB_PREFIX}.{_token(to)}" if to else f"{JOB_PREFIX}.event.{_token(row['kind'])}"
    kind = GOVERNANCE[source]
    if source == "switch_events" and row.get("kind"):
        kind = str(row["kind"])
    return f"{GOVERNANCE_PREFIX}.{_token(kind)}"


def event_id(source: str, seq: int) -> str:
    return f"{source}:{seq}"


def record_event(source: str, row: Mapping[str, Any]) -> Event:
    """The event of one committed row of an outbox table."""
    if source != JOB_EVENTS and source not in GOVERNANCE:
        raise ValueError(f"not an outbox table: {source!r}")
    eid = event_id(source, int(row["seq"]))
    body = {"event_id": eid, "source": source, **_decoded(row)}
    return Event(event_id=eid, subject=subject_of(source, row), body=body)


def agent_event(event: AgentEvent) -> Event:
    """The AgentEvent of one attempt; `intent_id` repeats the job id (a job is the intent)."""
    body = {**event.to_dict(), "intent_id": event.job_id}
    return Event(event_id=event.event_id, subject=AGENT_SUBJECT, body=body)


def ends_attempt(source: str, row: Mapping[str, Any]) -> tuple[str, int] | None:
    """(job id, attempt) when the row is the timeline line that ends an attempt: its AgentEvent,
    if it has one, committed before it and is published just before it."""
    if source == JOB_EVENTS and row.get("kind") == ATTEMPT_ENDED and row.get("attempt"):
        return str(row["job_id"]), int(row["attempt"])
    return None


@dataclass(frozen=True, slots=True)
class Window:
    """Where a round starts reading and how many rows the cursor jumps over first."""

    after: int
    skipped: int


def window(last_id: int, tip: int, max_backlog: int) -> Window:
    """The overflow rule: a sink more than `max_backlog` rows behind skips ahead to the newest
    `max_backlog` rows; the rows it skipped are counted on its cursor, never silently lost."""
    behind = tip - last_id
    if behind <= max_backlog:
        return Window(after=last_id, skipped=0)
    return Window(after=tip - max_backlog, skipped=behind - max_backlog)
