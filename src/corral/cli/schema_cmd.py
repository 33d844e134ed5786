"""`corral schema`: the JSON Schema of every JSON shape Corral prints or sends (schemas/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.domain.errors import NotFound
from corral.schemas import published as schemas

from .exits import fail

PUBLISHED = Path("docs/reference/schemas")  # where the repository keeps them


def schema(
    name: Annotated[
        str | None,
        typer.Argument(
            help="A model (Job, JobShow, ProtocolJob …); without one, the list of names."
        ),
    ] = None,
    write: Annotated[
        Path | None,
        typer.Option(
            "--write",
            help=f"Write every model's schema as NAME.json into this directory "
            f"(the repository publishes them in {PUBLISHED}).",
        ),
    ] = None,
) -> None:
    """Print the JSON Schema of what a command prints as JSON, or of a core protocol value."""
    if write is not None:
        write.mkdir(parents=True, exist_ok=True)
        for each in schemas.MODELS:
            (write / f"{each}.json").write_text(schemas.schema_text(each))
        typer.echo(f"wrote {len(schemas.MODELS)} schemas to {write}")
    elif name is None:
        typer.echo("\n".join(schemas.MODELS))
    elif name not in schemas.MODELS:
        fail(NotFound(f"no schema named {name!r}; `corral schema` lists them"))
    else:
        typer.echo(schemas.schema_text(name), nl=False)


def register(app: typer.Typer) -> None:
    """Add `corral schema` to the `corral` app."""
    app.command("schema")(schema)
