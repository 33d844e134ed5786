"""`corral config check` lists every problem of a configuration, not the first one: unknown
keys with their path, worker kinds that do not exist, names that point nowhere, bad values, and
the checks that need validated values (tool scopes, ray addresses) beside the type errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config import ConfigProblems, load
from corral.config_models import check, parse, resolve
from corral.domain.errors import Conflict
from corral.services.configs import check_config, init_config, starter_text

BAD = """\
default_environment: torch-dev-gpo
roles:
  build:
    concurrency: 0
    colour: red
    worker: claude-cde
  web:
    tools: ["Bash(rm"]
environments:
  torch-dev-gpu:
    kind: ray
scheduler:
  poll_intervl_s: 2
"""


def test_every_problem_is_listed_with_its_path() -> None:
    found = check(BAD, "corral.yaml")
    assert found[0].startswith(
        "scheduler.poll_intervl_s: unknown key (did you mean 'poll_interval_s'?"
    )
    assert "roles.build.concurrency: must be at least 1" in found
    assert any(p.startswith("roles.build.colour: unknown key") for p in found)
    assert any(
        p.startswith(
            "roles.build.worker: unknown worker kind 'claude-cde' (did you mean 'claude-code'?"
        )
        for p in found
    )
    assert "roles.web.tools: tool scope rule 'Bash(rm': missing `)`" in found
    assert (
        "environments.torch-dev-gpu.address: a ray environment needs the cluster address" in found
    )
    assert any(
        p.startswith("default_environment: unknown environment 'torch-dev-gpo' (did you mean")
        for p in found
    )
    assert len(found) == 7, found
    assert len(set(found)) == len(found)


def test_a_file_that_validates_still_has_every_resolve_problem_listed() -> None:
    text = """\
roles:
  a: {tools: ["Bash(rm"]}
  b: {tools: ["Bash(ls"]}
environments:
  x: {kind: ray}
  y: {kind: ray}
"""
    with pytest.raises(ConfigProblems) as err:
        resolve(parse(text, "c.yaml"), "c.yaml")
    assert len(err.value.problems) == 4, err.value.problems
    assert str(err.value).startswith("c.yaml: 4 problems: roles.a.tools:")
    assert check(text, "c.yaml") == err.value.problems


def test_loading_says_every_problem_too(tmp_path: Path) -> None:
    path = tmp_path / "corral.yaml"
    path.write_text("environments:\n  x: {kind: ray}\n  y: {kind: ray}\n")
    with pytest.raises(ConfigProblems, match=r"2 problems: environments\.x\.address") as err:
        load(data_dir=tmp_path, config_path=path)
    assert "(and 1 more)" not in str(err.value)
    path.write_text(BAD)  # type errors and what only resolving finds, in one message
    with pytest.raises(ConfigProblems) as err:
        load(data_dir=tmp_path, config_path=path)
    assert len(err.value.problems) == 6  # all but the default environment's name (check only)
    assert "roles.web.tools" in str(err.value) and "environments.torch-dev-gpu" in str(err.value)


def test_malformed_yaml_is_one_problem_with_its_line() -> None:
    (problem,) = check("roles:\n  a: [\n", "c.yaml")
    assert "malformed YAML" in problem and "line" in problem


def test_the_built_in_names_and_declared_names_are_fine() -> None:
    assert check("default_environment: gpu\nenvironments:\n  gpu: {kind: local}\n", "c") == []
    assert check("roles:\n  build: {}\n", "c") == []  # `default` stands alone
    assert check("default_role: biuld\nroles:\n  build: {}\n", "c") == [
        "default_role: unknown role 'biuld' (did you mean 'build'? known: build)"
    ]


def test_check_reads_the_file_a_command_would(tmp_path: Path) -> None:
    assert check_config(tmp_path / "data", None).source is None  # no file: the defaults
    path = tmp_path / "corral.yaml"
    path.write_text(BAD)
    found = check_config(tmp_path / "data", path)
    assert found.source == str(path) and not found.ok and len(found.problems) == 7


def test_init_writes_the_commented_example_and_refuses_to_overwrite(tmp_path: Path) -> None:
    written = init_config(tmp_path / "new")
    assert written == tmp_path / "new" / "corral.yaml"
    text = written.read_text()
    assert text == starter_text() and text.startswith("#")
    for section in ("roles:", "environments:", "guardrails"):
        assert section in text
    assert check(text, str(written)) == []
    written.write_text("# mine\n")
    with pytest.raises(Conflict, match="exists already"):
        init_config(tmp_path / "new")
    assert written.read_text() == "# mine\n"
    init_config(tmp_path / "new", force=True)
    assert written.read_text() == starter_text()
    assert [p.name for p in written.parent.iterdir()] == ["corral.yaml"]  # no temp file left
