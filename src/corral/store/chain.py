"""The audit hash chains of the append-only tables (docs/explanation/audit.md).

Design: one chain per table. Each row carries `seq` (its position, 1, 2, …, no gaps), `prev_hash`
(the previous row's `hash`, "" for the first) and `hash` = sha256 of the canonical JSON of the
table name and the row's columns (`hash` itself excluded, `prev_hash` and `seq` included). A
database-generated id (policy_evaluations.id) is not hashed: it is not known before the insert.

`audit_heads` holds each chain's tip (seq, hash). Appending takes the tip with an UPDATE, which
in PostgreSQL row-locks it until the transaction ends (SQLite's BEGIN IMMEDIATE serialises all
writers anyway): appends to one chain are serialised across engines, and whatever a transaction
reads after taking the tip (the budget ledger's sums) cannot change under it. The tip also lets
verification notice a truncated chain. Why per table rather than one ledger: the per-tool-call
policy evaluations do not queue behind approvals and reports, and a chain is verified on its own.

The tables also refuse UPDATE and DELETE by trigger (migrations 0006, 0012); the chain is what
shows tampering by someone who went around the triggers.

Keyed chain (migration 0012). A plain SHA-256 chain can be recomputed by whoever can
write the database. Rows are therefore hashed with HMAC-SHA256 under a key kept outside the
database (`<data dir>/audit.key`, 0600, the same key-file mechanism as the sealing key); such a
hash is stored as `k1:<hex>`, a plain one as 64 hex digits. `audit_heads.keyed_from` records the
first keyed seq of each chain: rows before it (written before the key existed) stay verifiable
with plain SHA-256, and the first keyed row's HMAC covers their tip through its `prev_hash`; a
plain row at or after it, or after any keyed row, is a chain recomputed without the key. What
the database cannot show (its newest rows removed with the head rewound, `keyed_from` reset) the
signed checkpoints written outside it do (store/checkpoints.py): verification takes them as
`Mark`s.

The job timeline (`job_events`) is chained too since 0012; its rows from before are outside
the chain (seq NULL) and reported as such, never as tampering, while they precede the chain.

This module is the chain's arithmetic, shared by both stores; store/chain_sql.py appends to and
walks the chains in a SQL database.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

from corral.core.ports import AuditKey
from corral.core.ports import ChainHead as Head
from corral.core.ports import ChainMark as Mark

__all__ = ["AuditKey", "Head", "Mark"]

# Hashed columns per chained table, in the table's column order (`hash` follows them).
CHAINS: dict[str, tuple[str, ...]] = {
    "policy_evaluations": (
        "at",
        "job_id",
        "attempt",
        "stage",
        "subject",
        "verdict",
        "reason",
        "message",
        "inputs",
        "seq",
        "prev_hash",
    ),
    "run_reports": (
        "id",
        "seq",
        "job_id",
        "role",
        "tenant",
        "workflow",
        "outcome",
        "attempts",
        "steps",
        "tool_calls",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "started_at",
        "ended_at",
        "duration_ms",
        "summary",
        "created_at",
        "metrics",
        "prev_hash",
    ),
    "incidents": (
        "id",
        "seq",
        "report_id",
        "job_id",
        "type",
        "severity",
        "message",
        "created_at",
        "context",
        "resolves",
        "prev_hash",
    ),
    "switch_events": (
        "seq",
        "kind",
        "switch_id",
        "action",
        "scope",
        "target",
        "reason",
        "at",
        "actor",
        "expires_at",
        "prev_hash",
    ),
    "budget_ceilings": (
        "seq",
        "scope",
        "target",
        "period",
        "ceiling_usd",
        "at",
        "actor",
        "prev_hash",
    ),
    "budget_ledger": (
        "seq",
        "kind",
        "job_id",
        "scope",
        "target",
        "amount",
        "charged_at",
        "at",
        "settles",
        "prev_hash",
    ),
    "dark_launches": ("seq", "workflow", "percentage", "enabled", "at", "actor", "prev_hash"),
    "approval_events": (
        "seq",
        "approval_id",
        "job_id",
        "subject",
        "digest",
        "reason",
        "requested_at",
        "expires_at",
        "state",
        "at",
        "actor",
        "note",
        "prev_hash",
    ),
    "token_events": (
        "seq",
        "token_id",
        "action",
        "tenant",
        "scopes",
        "name",
        "at",
        "actor",
        "expires_at",
        "prev_hash",
    ),
    "job_events": (
        "job_id",
        "at",
        "kind",
        "from_state",
        "to_state",
        "attempt",
        "message",
        "data",
        "seq",
        "prev_hash",
    ),
}
# The id a problem is reported under: the table's own id, else its chain position.
ROW_ID = {"policy_evaluations": "id", "run_reports": "id", "incidents": "id", "job_events": "id"}
# Tables whose rows from before their chain began stay outside it (seq NULL): not a problem
# while they precede the chain's first row.
PRECHAIN = frozenset({"job_events"})
# A keyed (HMAC-SHA256) hash is stored with this prefix; a plain SHA-256 one without.
KEYED = "k1:"
# REAL columns: hashed as floats whatever the caller passed (SQLite gives 1 back as 1.0).
_REAL = frozenset(
    {
        "at",
        "cost_usd",
        "started_at",
        "ended_at",
        "created_at",
        "expires_at",
        "ceiling_usd",
        "amount",
        "charged_at",
        "requested_at",
    }
)

Problem = tuple[str, str, str]  # (table, row id, why)


def normalise(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as the database will give it back (REAL as float, INTEGER as int)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v is not None and k in _REAL:
            v = float(v)
        elif isinstance(v, bool):
            v = int(v)
        out[k] = v
    return out


def canonical(table: str, row: Mapping[str, Any]) -> str:
    """What a row's hash is taken over: its hashed columns and its table, as canonical JSON."""
    content = {c: row.get(c) for c in CHAINS[table]}
    return json.dumps(
        {"table": table, "row": content},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def row_hash(table: str, row: Mapping[str, Any], key: bytes | None = None) -> str:
    """The row's hash: HMAC-SHA256 under `key` (`k1:` + hex), plain SHA-256 without one."""
    text = canonical(table, row).encode()
    if key is None:
        return hashlib.sha256(text).hexdigest()
    return KEYED + hmac.new(key, text, hashlib.sha256).hexdigest()


def link(
    table: str, row: Mapping[str, Any], seq: int, prev_hash: str, key: bytes | None = None
) -> dict[str, Any]:
    """The row placed at `seq` after `prev_hash`, with its own hash."""
    linked = {**normalise(row), "seq": seq, "prev_hash": prev_hash}
    linked["hash"] = row_hash(table, linked, key)
    return linked


class ChainCheck:
    """Walks one chain in seq order and notes every row that breaks it.

    `key`: the chain's key (None: keyed rows cannot be checked, which is itself reported);
    `marks`: the chain's signed checkpoints, which the walk must pass through unchanged."""

    def __init__(
        self,
        table: str,
        key: bytes | None = None,
        marks: Sequence[Mark] = (),
        start: Head | None = None,
    ) -> None:
        self.table = table
        self.key = key
        self.checked = 0
        self.prechain = 0  # rows from before the chain began (job_events), not on it
        self.chain_starts_at: int | None = None  # the id of the chain's first row (PRECHAIN)
        self.unchecked = 0  # keyed rows not checked for want of the key
        self.problems: list[Problem] = []
        self.marks = sorted(marks, key=lambda m: m.seq)
        self._mark = 0
        # Where the walk begins: after the segment retention archived (its last seq and hash),
        # or at the chain's start. Checkpoints inside the archived part are the archive's.
        self.start = start or Head(0, "")
        self._seq = self.start.seq
        self._hash = self.start.hash
        while self._mark < len(self.marks) and self.marks[self._mark].seq <= self._seq:
            self._mark += 1
        self._first_keyed: int | None = (
            self._seq if self._hash.startswith(KEYED) and self._seq else None
        )
        self._keyed_from = min((m.keyed_from for m in self.marks if m.keyed_from), default=None)

    def _bad(self, row: Mapping[str, Any], why: str) -> None:
        self.problems.append((self.table, str(row.get(ROW_ID.get(self.table, "seq"))), why))

    def feed(self, row: Mapping[str, Any]) -> None:
        self.checked += 1
        seq = row.get("seq")
        if seq is None or row.get("hash") is None:
            if (
                self.table in PRECHAIN
                and self._seq == self.start.seq
                and row.get("id") is not None
                and (self.chain_starts_at is None or int(row["id"]) < self.chain_starts_at)
            ):
                self.prechain += 1
                return
            self._bad(row, "row is not on the chain (no seq or hash)")
            return
        seq = int(seq)
        if seq != self._seq + 1:
            self._bad(
                row, f"seq {seq} follows {self._seq}: rows {self._seq + 1}…{seq - 1} are missing"
            )
        elif row.get("prev_hash") != self._hash:
            self._bad(row, "prev_hash does not match the previous row's hash")
        self._check_hash(row, seq, str(row["hash"]))
        while self._mark < len(self.marks) and self.marks[self._mark].seq <= seq:
            mark = self.marks[self._mark]
            self._mark += 1
            if mark.seq == seq and mark.hash != row["hash"]:
                self._bad(
                    row,
                    f"record seq {seq} differs from the checkpoint at {mark.when}"
                    " (the chain was rewritten from here)",
                )
        self._seq, self._hash = seq, str(row["hash"])

    def _check_hash(self, row: Mapping[str, Any], seq: int, stored: str) -> None:
        if stored.startswith(KEYED):
            if self._first_keyed is None:
                self._first_keyed = seq
            if self.key is None:
                self.unchecked += 1
                return
            if not hmac.compare_digest(row_hash(self.table, row, self.key), stored):
                self._bad(
                    row,
                    f"record seq {seq} changed: its HMAC does not match (changed,"
                    " or recomputed without the key)",
                )
            return
        keyed_from = self._keyed_from
        if self._first_keyed is not None or (keyed_from is not None and seq >= keyed_from):
            self._bad(
                row,
                f"record seq {seq} has a plain hash inside the keyed part of the"
                f" chain (from seq {self._first_keyed or keyed_from}): recomputed"
                " without the key",
            )
        elif row_hash(self.table, row) != stored:
            self._bad(row, "content does not match its hash (the row was changed)")

    def finish(self, head: Head | tuple[int, str] | None) -> None:
        """Compare the walk's end with the recorded tip (catches a truncated chain) and with
        the last checkpoint (catches one truncated with its tip rewound)."""
        if isinstance(head, tuple):
            head = Head(*head)
        tip = head or Head(0, "")
        if (self._seq, self._hash) != (tip.seq, tip.hash):
            self.problems.append(
                (
                    self.table,
                    str(tip.seq),
                    f"chain head is seq {tip.seq} but the rows end at seq"
                    f" {self._seq} (rows were removed or the head was changed)",
                )
            )
        if self.marks and self.marks[-1].seq > self._seq:
            last = self.marks[-1]
            self.problems.append(
                (
                    self.table,
                    str(self._seq),
                    f"chain {self.table}: {last.seq - self._seq} records after seq"
                    f" {self._seq} missing (checkpoint at {last.when} says head"
                    f" seq {last.seq})",
                )
            )
        if (
            self._keyed_from is not None
            and tip.keyed_from != self._keyed_from
            and tip.seq >= self._keyed_from
        ):
            said = (
                f"starts at seq {tip.keyed_from}"
                if tip.keyed_from is not None
                else "has no keyed record"
            )
            self.problems.append(
                (
                    self.table,
                    str(tip.seq),
                    f"the head says the keyed chain {said}, the checkpoints say"
                    f" it starts at seq {self._keyed_from}",
                )
            )
        if self.unchecked:
            self.problems.append(
                (
                    self.table,
                    str(self._first_keyed),
                    f"{self.unchecked} keyed records cannot be checked: no audit"
                    " key (audit.key is missing)",
                )
            )


def verify_rows(
    table: str,
    rows: Sequence[Mapping[str, Any]],
    head: Head | tuple[int, str] | None,
    key: bytes | None = None,
    marks: Sequence[Mark] = (),
    start: Head | None = None,
) -> ChainCheck:
    """Check a whole chain held in memory (unchained rows first, then by seq), from `start`
    (the archived head) when part of it was archived."""
    check = ChainCheck(table, key, marks, start)
    for row in sorted(rows, key=lambda r: (r.get("seq") is not None, r.get("seq") or 0)):
        check.feed(row)
    check.finish(head)
    return check
