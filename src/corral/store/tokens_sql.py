"""The HTTP API's bearer tokens over SQL (the TokenStore port, core/ports.py; table api_tokens,
migration 0014)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from corral.domain.errors import Conflict, NotFound
from corral.domain.tokens import CREATED, REVOKED, ApiToken, TokenEvent
from corral.store.chain import CHAINS
from corral.store.chain_sql import ChainWriter
from corral.store.driver import Driver, Row, Tx
from corral.store.govrows import token_event_from_row, token_event_row

_COLUMNS = (
    "id, name, tenant, scopes, secret_hash, created_at, created_by, expires_at,"
    " revoked_at, revoked_by"
)


def _token(row: Row) -> ApiToken:
    return ApiToken(
        id=row["id"],
        name=row["name"],
        tenant=row["tenant"],
        scopes=tuple(s for s in row["scopes"].split(",") if s),
        secret_hash=row["secret_hash"],
        created_at=float(row["created_at"]),
        created_by=row["created_by"],
        expires_at=None if row["expires_at"] is None else float(row["expires_at"]),
        revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]),
        revoked_by=row["revoked_by"],
    )


class SqlTokens:
    """Mixed into SqlStore."""

    driver: Driver

    _chain_key: Callable[[Tx], Awaitable[bytes | None]]  # SqlGovernance's: the audit key

    async def _audit(self, tx: Tx, token: ApiToken, action: str, at: float, by: str) -> None:
        chain = await ChainWriter.take(tx, "token_events", await self._chain_key(tx))
        await chain.append(token_event_row(token, action, at=at, by=by))
        await chain.flush()

    async def create_token(self, token: ApiToken) -> None:
        async with self.driver.write() as tx:
            await self._audit(tx, token, CREATED, token.created_at, token.created_by)
            await tx.execute(
                f"INSERT INTO api_tokens ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    token.id,
                    token.name,
                    token.tenant,
                    ",".join(token.scopes),
                    token.secret_hash,
                    token.created_at,
                    token.created_by,
                    token.expires_at,
                    token.revoked_at,
                    token.revoked_by,
                ),
            )

    async def token(self, token_id: str) -> ApiToken:
        async with self.driver.read() as tx:
            row = await tx.fetchone(f"SELECT {_COLUMNS} FROM api_tokens WHERE id = ?", (token_id,))
        if row is None:
            raise NotFound(f"no token {token_id}")
        return _token(row)

    async def tokens(self) -> list[ApiToken]:
        async with self.driver.read() as tx:
            rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM api_tokens ORDER BY created_at, id")
        return [_token(r) for r in rows]

    async def revoke_token(self, token_id: str, *, at: float, by: str) -> ApiToken:
        async with self.driver.write() as tx:
            row = await tx.fetchone(f"SELECT {_COLUMNS} FROM api_tokens WHERE id = ?", (token_id,))
            if row is None:
                raise NotFound(f"no token {token_id}")
            if row["revoked_at"] is not None:
                raise Conflict(f"token {token_id} is already revoked")
            await tx.execute(
                "UPDATE api_tokens SET revoked_at = ?, revoked_by = ?"
                " WHERE id = ? AND revoked_at IS NULL",
                (at, by, token_id),
            )
            revoked = _token({**dict(row), "revoked_at": at, "revoked_by": by})
            await self._audit(tx, revoked, REVOKED, at, by)
        return revoked

    async def token_events(self) -> list[TokenEvent]:
        cols = ", ".join(CHAINS["token_events"])
        async with self.driver.read() as tx:
            rows = await tx.fetchall(f"SELECT {cols} FROM token_events ORDER BY seq")
        return [token_event_from_row(r) for r in rows]
