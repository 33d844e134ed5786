"""`corral token create|list|revoke`: bearer tokens of the HTTP API (services/tokens.py,
docs/reference/http-api.md). The token's text is printed once, at creation; only its hash is
stored."""

from __future__ import annotations

import getpass
from typing import Annotated

import typer

from corral.domain.errors import CorralError
from corral.runtime.control import operator_only
from corral.schemas import views as schemas
from corral.services import tokens

from .edge import config_or_fail, emit, with_store
from .exits import fail
from .options import ConfigOpt, DataDir, JsonOpt
from .views import console, id_column, new_table, short_time

app = typer.Typer(
    no_args_is_help=True, help="Bearer tokens of the HTTP API: create (shown once), list, revoke."
)


@app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose jobs it sees.")],
    scopes: Annotated[
        str,
        typer.Option(
            "--scopes",
            help="Comma-separated: jobs:read, jobs:write, approve, govern, "
            "metrics, admin (admin implies every other).",
        ),
    ],
    expires_in: Annotated[
        str | None,
        typer.Option("--expires-in", help="Lifetime: 30d, 12h, 90m or seconds (default: none)."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="A label for people.")] = None,
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Create a token and print it, once: only its hash is kept."""
    try:
        lifetime = None if expires_in is None else tokens.duration_s(expires_in)
    except CorralError as err:
        fail(err)
    cfg = config_or_fail(data_dir, config)
    operator_only(cfg.data_dir, "token create")
    made = with_store(
        cfg,
        lambda st: tokens.create(
            st, tenant=tenant, scopes=scopes, name=name, expires_in_s=lifetime, by=getpass.getuser()
        ),
    )
    if as_json:
        emit(schemas.TokenCreated.created(made.token, made.text).dump())
        return
    typer.echo(made.text)
    typer.echo(
        f"token {made.token.id} for tenant {made.token.tenant} "
        f"({', '.join(made.token.scopes)}): shown this once, keep it secret",
        err=True,
    )


@app.command("list")
def token_list(
    as_json: JsonOpt = False, data_dir: DataDir = None, config: ConfigOpt = None
) -> None:
    """Every token, revoked ones too (never a secret)."""
    cfg = config_or_fail(data_dir, config)
    found = with_store(cfg, tokens.list_tokens)
    if as_json:
        emit([schemas.Token.of(t).dump() for t in found])
        return
    table = new_table()
    id_column(table, "ID", [t.id for t in found])
    for header in ("NAME", "TENANT", "SCOPES", "CREATED", "EXPIRES", "REVOKED"):
        table.add_column(header)
    for t in found:
        table.add_row(
            t.id,
            t.name or "-",
            t.tenant,
            ",".join(t.scopes),
            short_time(t.created_at),
            short_time(t.expires_at),
            short_time(t.revoked_at),
        )
    console.print(table)


@app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="The token's id.")],
    as_json: JsonOpt = False,
    data_dir: DataDir = None,
    config: ConfigOpt = None,
) -> None:
    """Revoke a token at once: every call presenting it is refused from now on."""
    cfg = config_or_fail(data_dir, config)
    operator_only(cfg.data_dir, "token revoke")
    revoked = with_store(cfg, lambda st: tokens.revoke(st, token_id, by=getpass.getuser()))
    if as_json:
        emit(schemas.Token.of(revoked).dump())
    else:
        typer.echo(f"revoked token {revoked.id}")
