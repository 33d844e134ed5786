"""typer converts `corral`'s options without pydantic where its answer cannot differ
(cli/lazy.py): it built a pydantic adapter for each option, even an unset one, and pydantic
with its first adapter was a third of `corral jobs --json`'s start."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import pytest
import typer
import typer.core
from typer.testing import CliRunner

from corral.cli import lazy

# ---- typer's options without pydantic: the same answers as typer's own conversion


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


demo = typer.Typer()


@demo.command()
def _show(
    name: Annotated[str | None, typer.Option("--name")] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=9)] = 3,
    ratio: Annotated[float, typer.Option("--ratio", min=0.0)] = 0.5,
    where: Annotated[Path | None, typer.Option("--where")] = None,
    real: Annotated[Path | None, typer.Option("--real", exists=True, dir_okay=False)] = None,
    colour: Annotated[Colour | None, typer.Option("--colour", case_sensitive=False)] = None,
    tags: Annotated[list[str] | None, typer.Option("--tag")] = None,
    flag: Annotated[bool, typer.Option("--flag")] = False,
) -> None:
    typer.echo(repr((name, count, ratio, where, real, colour, tags, flag)))


CASES = [
    [],
    ["--name", "x"],
    ["--name", ""],
    ["--count", "4"],
    ["--count", "0"],
    ["--count", "10"],
    ["--count", "x"],
    ["--ratio", "2"],
    ["--ratio", "-1"],
    ["--where", "a/b/"],
    ["--where", ""],
    ["--where", "~/x"],
    ["--real", "missing"],
    ["--real", "."],
    ["--real", __file__],
    ["--colour", "RED"],
    ["--colour", "green"],
    ["--tag", "a", "--tag", "b"],
    ["--flag"],
    ["--help"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) or "defaults" for c in CASES])
def test_options_convert_as_typer_converts_them(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    coercion = pytest.importorskip("typer._coercion")  # typer 0.2x: pydantic converts
    light = CliRunner().invoke(demo, args)
    monkeypatch.setattr(typer.core, "build_runtime_param", coercion.build_runtime_param)
    own = CliRunner().invoke(demo, args)
    assert (light.exit_code, light.output) == (own.exit_code, own.output)


def test_the_light_conversion_is_the_one_typer_uses() -> None:
    pytest.importorskip("typer._coercion")
    assert typer.core.build_runtime_param is lazy._light_or_full
