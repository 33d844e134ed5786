"""`corral jobs --json` on a store that exists builds and imports only what it uses: typer's
options converted without pydantic (cli/lazy.py), the SQLite file read with sqlite3 alone
(store/peek.py), no configuration models when there is no configuration file. It took 0.22 to
0.30 s to start with them (bench/scenarios.py `CLI`); this holds the path, not a time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated

import anyio
import pytest
import typer
import typer.core
from typer.testing import CliRunner

from corral.cli import lazy
from corral.config import load
from corral.config_paths import DB_NAME, SQLITE_BUSY_TIMEOUT_MS
from corral.core.ports import JobQuery
from corral.domain.states import JobState
from corral.store import migrate, peek
from corral.store.sqlite import SqliteStore
from tests.contract.test_store_contract import AGING, NOW, make_job

# What the steady `corral jobs --json` must not import: pydantic (typer's adapters, the
# configuration's models), YAML, the async store and every port, the event loop, the store
# drivers, the services, importlib.metadata; and the other command modules, the engine, the
# guardrails and the schema models (an empty list has nothing to dump).
HEAVY = (
    "corral.cli.governance",
    "corral.cli.guard",
    "corral.cli.policy_cmds",
    "corral.cli.world",
    "corral.cli.waiting",
    "corral.runtime.engine",
    "corral.policy.guardrails",
    "corral.schemas.views",
    "corral.services.submissions",
    "pydantic",
    "typer._adapters",
    "corral.config",
    "yaml",
    "corral.core.ports",
    "corral.store.sql",
    "corral.store.sqlite",
    "corral.store.postgres",
    "corral.store.migrate",
    "psycopg",
    "asyncio",
    "corral.runtime.assembly",
    "corral.services.queries",
    "importlib.metadata",
)

PROBE = """
import json, sys
sys.argv = ["corral", *sys.argv[1:]]
from corral.main import main
try:
    main()
except SystemExit as end:
    code = end.code
ran = sorted(n for n, m in sys.modules.items() if type(m).__name__ != "_LazyModule")
sys.stderr.write("\\n" + json.dumps({"code": code, "modules": ran}) + "\\n")
"""


def _probe(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, dict]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**base, **(env or {})},
        check=False,
    )
    return r.stdout, json.loads(r.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["option", "environment"])
def test_listing_jobs_imports_none_of_the_heavy_modules(tmp_path: Path, how: str) -> None:
    data = str(tmp_path / "data")
    args, env = (["--data-dir", data], None) if how == "option" else ([], {"CORRAL_DATA_DIR": data})
    first, probe = _probe(tmp_path, "jobs", "--json", *args, env=env)  # creates the store
    assert probe["code"] == 0 and json.loads(first) == []
    out, probe = _probe(tmp_path, "jobs", "--json", *args, env=env)
    assert probe["code"] == 0 and json.loads(out) == []
    assert "corral.cli.jobs" in probe["modules"]
    assert [m for m in HEAVY if m in probe["modules"]] == []
    table, probe = _probe(tmp_path, "jobs", *args, env=env)
    assert probe["code"] == 0 and table.strip() == "no jobs"


def test_a_configuration_file_is_still_loaded_and_validated(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _probe(tmp_path, "jobs", "--json", "--data-dir", str(data))
    (tmp_path / "corral.yaml").write_text("scheduler: {max_queued: -1}\n")
    out, probe = _probe(tmp_path, "jobs", "--json", "--data-dir", str(data))
    assert probe["code"] == 2 and out == ""
    assert "corral.config" in probe["modules"]


def test_with_a_configuration_file_and_jobs_short_commands_import_no_pydantic(
    tmp_path: Path,
) -> None:
    """The file validated once and cached (config_cache.py), the jobs dumped without their
    models (schemas/plain.py): pydantic only for what only it can do."""
    (tmp_path / "corral.yaml").write_text("roles: {default: {concurrency: 2}}\n")
    env = {"CORRAL_DATA_DIR": str(tmp_path / "data")}
    for _ in range(2):  # the data directory, then the cache
        out, probe = _probe(tmp_path, "submit", "-q", "--", "true", env=env)
        assert probe["code"] == 0
    job = out.strip()
    for args in (
        ("submit", "-q", "--", "true"),
        ("show", job, "--json"),
        ("jobs", "--json"),
        ("cancel", job),
    ):
        out, probe = _probe(tmp_path, *args, env=env)
        assert probe["code"] == 0, args
        heavy = [m for m in probe["modules"] if m.split(".")[0] == "pydantic"]
        assert heavy + [m for m in probe["modules"] if m == "corral.config_models"] == [], args
        if args[0] == "show":
            assert json.loads(out)["id"] == job and json.loads(out)["state"] == "QUEUED"
        if args[0] == "jobs":
            assert len(json.loads(out)) == 3


# ---- typer's options without pydantic: the same answers as typer's own conversion


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Level(StrEnum):
    LOW = "LOW"
    HIGH = "HIGH"


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
    limit: Annotated[float | None, typer.Option("--limit", min=0.5)] = None,
    cap: Annotated[int | None, typer.Option("--cap", max=100)] = None,
    shade: Annotated[Colour, typer.Option("--shade")] = Colour.BLUE,
    level: Annotated[Level | None, typer.Option("--level", case_sensitive=False)] = None,
    argv: Annotated[list[str] | None, typer.Argument()] = None,
) -> None:
    typer.echo(
        repr((name, count, ratio, where, real, colour, tags, flag, limit, cap, shade, level, argv))
    )


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
    ["--colour", "red"],
    ["--colour", "Blue"],
    ["--shade", "red"],
    ["--shade", "RED"],
    ["--shade", "green"],
    *(["--level", v] for v in ("low", "LOW", "High", "mid", "")),
    ["--tag", "a", "--tag", "b"],
    ["--flag"],
    ["--help"],
    *(["--limit", v] for v in ("1", "0.5", "0.25", "-2", "007", "1.50", "1e3", " 2", "1_0")),
    *(["--limit", v] for v in ("inf", "nan", "x", "", "1." + "0" * 20, "9" * 400)),
    *(["--cap", v] for v in ("1", "-0", "007", "100", "101", "1.0", "+3", "9" * 5000)),
    ["--", "echo", "hi"],
    ["--", "sh", "-c", "exit 3", ""],
    ["--tag", "a", "--", "x"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c)[:40] or "defaults" for c in CASES])
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


# ---- the SQLite file read alone: the store's answers, or None


def test_the_latest_migration_is_the_one_migrate_applies() -> None:
    assert peek.latest_version() == migrate.migrations("sqlite")[-1][0]


def test_the_defaults_are_the_configurations(tmp_path: Path) -> None:
    cfg = load(data_dir=tmp_path)
    assert cfg.source is None and cfg.store_url is None
    assert cfg.db_path == tmp_path.resolve() / DB_NAME
    assert cfg.sqlite_busy_timeout_ms == SQLITE_BUSY_TIMEOUT_MS


def test_a_read_of_the_file_lists_what_the_store_lists(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    queries = [
        JobQuery(),
        JobQuery(limit=2),
        JobQuery(state=JobState.QUEUED),
        JobQuery(role="r1"),
        JobQuery(text="ECHO"),
        JobQuery(ref="zzzzzzzz"),
    ]

    async def body() -> list[list[str]]:
        store = SqliteStore(db)
        await store.open()
        try:
            for i in range(5):
                job = make_job(command=("ECHO", str(i)), role=f"r{i % 2}")
                await store.submit(job, now=NOW, aging_s=AGING)
            return [[j.id for j in await store.list_jobs(q)] for q in queries]
        finally:
            await store.close()

    stored = anyio.run(body)
    read = [peek.list_jobs(db, q, busy_timeout_ms=100) for q in queries]
    assert [None if r is None else [j.id for j in r] for r in read] == stored


def test_a_file_the_store_must_open_first_is_not_read(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    assert peek.list_jobs(db, JobQuery(), busy_timeout_ms=100) is None  # no file
    assert not db.exists()  # and none made
    anyio.run(_open_and_close, db)
    assert peek.list_jobs(db, JobQuery(), busy_timeout_ms=100) == []
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM schema_migrations WHERE version = ?", (peek.latest_version(),))
    conn.commit()
    conn.close()
    assert peek.list_jobs(db, JobQuery(), busy_timeout_ms=100) is None  # behind: migrate first
    db.write_bytes(b"not a database")
    assert peek.list_jobs(db, JobQuery(), busy_timeout_ms=100) is None  # the store says why


async def _open_and_close(db: Path) -> None:
    store = SqliteStore(db)
    await store.open()
    await store.close()
