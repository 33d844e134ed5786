"""The audit hash chains in a SQL database: appending under the locked tip, reading the tips,
walking a table's chain a page at a time, and the append-only triggers (store/chain.py has the
arithmetic and the design)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.store.chain import CHAINS, PRECHAIN, ROW_ID, ChainCheck, Head, Mark, link
from corral.store.driver import Tx

_TAKE = "UPDATE audit_heads SET seq = seq WHERE chain = ? RETURNING seq, hash, keyed_from"


class ChainWriter:
    """Appends to one chain inside an open write transaction (take → append… → flush);
    keyed when given a key."""

    def __init__(self, tx: Tx, table: str, head: Head, key: bytes | None = None) -> None:
        self.tx, self.table, self.seq, self.tip = tx, table, head.seq, head.hash
        self.key, self.keyed_from = key, head.keyed_from
        cols = (*CHAINS[table], "hash")
        self._insert = (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        )

    @classmethod
    async def take(cls, tx: Tx, table: str, key: bytes | None = None) -> ChainWriter:
        """Lock the chain's tip for the rest of the transaction."""
        row = await tx.fetchone(_TAKE, (table,))
        if row is None:  # the chain's first append ever
            await tx.execute(
                "INSERT INTO audit_heads (chain, seq, hash) VALUES (?, 0, '')"
                " ON CONFLICT (chain) DO NOTHING",
                (table,),
            )
            row = await tx.fetchone(_TAKE, (table,))
        assert row is not None
        keyed_from = row["keyed_from"]
        return cls(
            tx,
            table,
            Head(
                int(row["seq"]), str(row["hash"]), None if keyed_from is None else int(keyed_from)
            ),
            key,
        )

    async def append(self, row: Mapping[str, Any]) -> dict[str, Any]:
        linked = link(self.table, row, self.seq + 1, self.tip, self.key)
        await self.tx.execute(self._insert, [linked[c] for c in (*CHAINS[self.table], "hash")])
        self.seq, self.tip = linked["seq"], linked["hash"]
        if self.key is not None and self.keyed_from is None:
            self.keyed_from = self.seq
        return linked

    async def flush(self) -> None:
        await self.tx.execute(
            "UPDATE audit_heads SET seq = ?, hash = ?, keyed_from = ? WHERE chain = ?",
            (self.seq, self.tip, self.keyed_from, self.table),
        )


async def read_heads(tx: Tx) -> dict[str, Head]:
    """Every chain's tip as the database records it."""
    rows = await tx.fetchall("SELECT chain, seq, hash, keyed_from FROM audit_heads")
    return {
        str(r["chain"]): Head(
            int(r["seq"]), str(r["hash"]), None if r["keyed_from"] is None else int(r["keyed_from"])
        )
        for r in rows
    }


async def verify_table(
    tx: Tx, table: str, *, key: bytes | None = None, marks: Sequence[Mark] = (), page: int = 1000
) -> ChainCheck:
    """Walk one table's chain from the database, a page at a time.

    The tip is read first and the walk stops there: rows appended meanwhile by another engine
    (committed with a later tip) are left for the next verification."""
    tip = (await read_heads(tx)).get(table)
    start = await tx.fetchone("SELECT seq, hash FROM archive_heads WHERE chain = ?", (table,))
    check = ChainCheck(
        table, key, marks, Head(int(start["seq"]), str(start["hash"])) if start else None
    )
    id_col = ROW_ID.get(table, "seq")
    cols = ", ".join(dict.fromkeys((id_col, *CHAINS[table], "hash")))
    if table in PRECHAIN:
        first = await tx.fetchone(f"SELECT MIN({id_col}) AS id FROM {table} WHERE seq IS NOT NULL")
        check.chain_starts_at = None if first is None or first["id"] is None else int(first["id"])
    for row in await tx.fetchall(
        f"SELECT {cols} FROM {table} WHERE seq IS NULL OR hash IS NULL ORDER BY {id_col}"
    ):
        check.feed(dict(row))
    after, last = check.start.seq, tip.seq if tip else 0
    while True:
        rows = await tx.fetchall(
            f"SELECT {cols} FROM {table} WHERE seq > ? AND seq <= ?"
            " AND hash IS NOT NULL ORDER BY seq LIMIT ?",
            (after, last, page),
        )
        for row in rows:
            check.feed(dict(row))
        if len(rows) < page:
            break
        after = int(rows[-1]["seq"])
    if tip is None:  # no tip: every row is past it (the head row itself was removed)
        for row in await tx.fetchall(
            f"SELECT {cols} FROM {table} WHERE seq IS NOT NULL"
            " AND hash IS NOT NULL ORDER BY seq LIMIT 1"
        ):
            check.problems.append((table, str(row[id_col]), "rows exist but the chain has no head"))
    check.finish(tip)
    return check


async def seal_legacy_evaluations(tx: Tx) -> None:
    """Migration 0005 → 0006: put policy evaluations written before the chain on it, in id order
    (runs before the append-only triggers exist)."""
    cols = ", ".join(c for c in CHAINS["policy_evaluations"] if c not in ("seq", "prev_hash"))
    rows = await tx.fetchall(
        f"SELECT id, {cols} FROM policy_evaluations WHERE hash IS NULL ORDER BY id"
    )
    if not rows:
        return
    row = await tx.fetchone(
        "UPDATE audit_heads SET seq = seq WHERE chain = ? RETURNING seq, hash",
        ("policy_evaluations",),
    )
    if row is None:
        await tx.execute(
            "INSERT INTO audit_heads (chain, seq, hash) VALUES (?, 0, '')"
            " ON CONFLICT (chain) DO NOTHING",
            ("policy_evaluations",),
        )
    writer = ChainWriter(
        tx, "policy_evaluations", Head(int(row["seq"]), str(row["hash"])) if row else Head(0, "")
    )
    for row in rows:
        linked = link("policy_evaluations", dict(row), writer.seq + 1, writer.tip)
        await tx.execute(
            "UPDATE policy_evaluations SET seq = ?, prev_hash = ?, hash = ? WHERE id = ?",
            (linked["seq"], linked["prev_hash"], linked["hash"], row["id"]),
        )
        writer.seq, writer.tip = linked["seq"], linked["hash"]
    await tx.execute(
        "UPDATE audit_heads SET seq = ?, hash = ? WHERE chain = ?",
        (writer.seq, writer.tip, "policy_evaluations"),
    )


def append_only_triggers(dialect: str) -> list[str]:
    """The triggers that make every chained table append-only (migrations 0006, 0012)."""
    suffixes = (
        ("_no_update", "_no_delete") if dialect == "sqlite" else ("_append_only", "_no_truncate")
    )
    return [t + s for t in CHAINS for s in suffixes]
