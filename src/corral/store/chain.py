"""The audit hash chains of the append-only tables (issue 5; seed-semantics §2.7, §5.2–5.4).

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

The tables also refuse UPDATE and DELETE by trigger (migrations 0006); the chain is what shows
tampering by someone who went around the triggers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.store.sql import Tx

# Hashed columns per chained table, in the table's column order (`hash` follows them).
CHAINS: dict[str, tuple[str, ...]] = {
    "policy_evaluations": ("at", "job_id", "attempt", "stage", "subject", "verdict", "reason",
                           "message", "inputs", "seq", "prev_hash"),
    "run_reports": ("id", "seq", "job_id", "role", "tenant", "workflow", "outcome", "attempts",
                    "steps", "tool_calls", "tokens_in", "tokens_out", "cost_usd", "started_at",
                    "ended_at", "duration_ms", "summary", "created_at", "metrics", "prev_hash"),
    "incidents": ("id", "seq", "report_id", "job_id", "type", "severity", "message",
                  "created_at", "context", "resolves", "prev_hash"),
    "switch_events": ("seq", "kind", "switch_id", "action", "scope", "target", "reason", "at",
                      "actor", "expires_at", "prev_hash"),
    "budget_ceilings": ("seq", "scope", "target", "period", "ceiling_usd", "at", "actor",
                        "prev_hash"),
    "budget_ledger": ("seq", "kind", "job_id", "scope", "target", "amount", "charged_at", "at",
                      "settles", "prev_hash"),
    "dark_launches": ("seq", "workflow", "percentage", "enabled", "at", "actor", "prev_hash"),
    "approval_events": ("seq", "approval_id", "job_id", "subject", "digest", "reason",
                        "requested_at", "expires_at", "state", "at", "actor", "note",
                        "prev_hash"),
}
# The id a problem is reported under: the table's own id, else its chain position.
ROW_ID = {"policy_evaluations": "id", "run_reports": "id", "incidents": "id"}
# REAL columns: hashed as floats whatever the caller passed (SQLite gives 1 back as 1.0).
_REAL = frozenset({"at", "cost_usd", "started_at", "ended_at", "created_at", "expires_at",
                   "ceiling_usd", "amount", "charged_at", "requested_at"})

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
    return json.dumps({"table": table, "row": content}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def row_hash(table: str, row: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(table, row).encode()).hexdigest()


def link(table: str, row: Mapping[str, Any], seq: int, prev_hash: str) -> dict[str, Any]:
    """The row placed at `seq` after `prev_hash`, with its own hash."""
    linked = {**normalise(row), "seq": seq, "prev_hash": prev_hash}
    linked["hash"] = row_hash(table, linked)
    return linked


class ChainCheck:
    """Walks one chain in seq order and notes every row that breaks it."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.checked = 0
        self.problems: list[Problem] = []
        self._seq = 0
        self._hash = ""

    def _bad(self, row: Mapping[str, Any], why: str) -> None:
        self.problems.append((self.table, str(row.get(ROW_ID.get(self.table, "seq"))), why))

    def feed(self, row: Mapping[str, Any]) -> None:
        self.checked += 1
        seq = row.get("seq")
        if seq is None or row.get("hash") is None:
            self._bad(row, "row is not on the chain (no seq or hash)")
            return
        if int(seq) != self._seq + 1:
            self._bad(row, f"seq {seq} follows {self._seq}: rows {self._seq + 1}…{int(seq) - 1}"
                           " are missing")
        elif row.get("prev_hash") != self._hash:
            self._bad(row, "prev_hash does not match the previous row's hash")
        if row_hash(self.table, row) != row.get("hash"):
            self._bad(row, "content does not match its hash (the row was changed)")
        self._seq, self._hash = int(seq), str(row["hash"])

    def finish(self, head: tuple[int, str] | None) -> None:
        """Compare the walk's end with the recorded tip (catches a truncated chain)."""
        tip = head or (0, "")
        if (self._seq, self._hash) != tip:
            self.problems.append((self.table, str(tip[0]),
                                  f"chain head is seq {tip[0]} but the rows end at seq"
                                  f" {self._seq} (rows were removed or the head was changed)"))


def verify_rows(table: str, rows: Sequence[Mapping[str, Any]],
                head: tuple[int, str] | None) -> ChainCheck:
    """Check a whole chain held in memory (unchained rows first, then by seq)."""
    check = ChainCheck(table)
    for row in sorted(rows, key=lambda r: (r.get("seq") is not None, r.get("seq") or 0)):
        check.feed(row)
    check.finish(head)
    return check


# ---- SQL --------------------------------------------------------------------------------------

_TAKE = "UPDATE audit_heads SET seq = seq WHERE chain = ? RETURNING seq, hash"


class ChainWriter:
    """Appends to one chain inside an open write transaction (take → append… → flush)."""

    def __init__(self, tx: Tx, table: str, seq: int, tip: str) -> None:
        self.tx, self.table, self.seq, self.tip = tx, table, seq, tip
        cols = (*CHAINS[table], "hash")
        self._insert = (f"INSERT INTO {table} ({', '.join(cols)})"
                        f" VALUES ({', '.join('?' * len(cols))})")

    @classmethod
    async def take(cls, tx: Tx, table: str) -> ChainWriter:
        """Lock the chain's tip for the rest of the transaction."""
        row = await tx.fetchone(_TAKE, (table,))
        if row is None:  # the chain's first append ever
            await tx.execute("INSERT INTO audit_heads (chain, seq, hash) VALUES (?, 0, '')"
                             " ON CONFLICT (chain) DO NOTHING", (table,))
            row = await tx.fetchone(_TAKE, (table,))
        assert row is not None
        return cls(tx, table, int(row["seq"]), str(row["hash"]))

    async def append(self, row: Mapping[str, Any]) -> dict[str, Any]:
        linked = link(self.table, row, self.seq + 1, self.tip)
        await self.tx.execute(self._insert, [linked[c] for c in (*CHAINS[self.table], "hash")])
        self.seq, self.tip = linked["seq"], linked["hash"]
        return linked

    async def flush(self) -> None:
        await self.tx.execute("UPDATE audit_heads SET seq = ?, hash = ? WHERE chain = ?",
                              (self.seq, self.tip, self.table))


async def verify_table(tx: Tx, table: str, *, page: int = 1000) -> ChainCheck:
    """Walk one table's chain from the database, a page at a time.

    The tip is read first and the walk stops there: rows appended meanwhile by another engine
    (committed with a later tip) are left for the next verification."""
    head = await tx.fetchone("SELECT seq, hash FROM audit_heads WHERE chain = ?", (table,))
    tip = (int(head["seq"]), str(head["hash"])) if head else None
    check = ChainCheck(table)
    cols = ", ".join(dict.fromkeys((ROW_ID.get(table, "seq"), *CHAINS[table], "hash")))
    for row in await tx.fetchall(f"SELECT {cols} FROM {table} WHERE seq IS NULL OR hash IS NULL"):
        check.feed(dict(row))
    after, last = 0, tip[0] if tip else 0
    while True:
        rows = await tx.fetchall(f"SELECT {cols} FROM {table} WHERE seq > ? AND seq <= ?"
                                 " AND hash IS NOT NULL ORDER BY seq LIMIT ?", (after, last, page))
        for row in rows:
            check.feed(dict(row))
        if len(rows) < page:
            break
        after = int(rows[-1]["seq"])
    if tip is None:  # no tip: every row is past it (the head row itself was removed)
        for row in await tx.fetchall(f"SELECT {cols} FROM {table} WHERE seq IS NOT NULL"
                                     " AND hash IS NOT NULL ORDER BY seq LIMIT 1"):
            check.problems.append((table, str(row[ROW_ID.get(table, "seq")]),
                                   "rows exist but the chain has no head"))
    check.finish(tip)
    return check


async def seal_legacy_evaluations(tx: Tx) -> None:
    """Migration 0005 → 0006: put policy evaluations written before the chain on it, in id order
    (runs before the append-only triggers exist)."""
    cols = ", ".join(c for c in CHAINS["policy_evaluations"] if c not in ("seq", "prev_hash"))
    rows = await tx.fetchall(f"SELECT id, {cols} FROM policy_evaluations WHERE hash IS NULL"
                             " ORDER BY id")
    if not rows:
        return
    writer = await ChainWriter.take(tx, "policy_evaluations")
    for row in rows:
        linked = link("policy_evaluations", dict(row), writer.seq + 1, writer.tip)
        await tx.execute("UPDATE policy_evaluations SET seq = ?, prev_hash = ?, hash = ?"
                         " WHERE id = ?", (linked["seq"], linked["prev_hash"], linked["hash"],
                                           row["id"]))
        writer.seq, writer.tip = linked["seq"], linked["hash"]
    await writer.flush()
