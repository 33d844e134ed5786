"""`corral init` and `corral config check` as a user runs them: exit codes, one problem a
line, escaped keys, --json."""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.conftest import Corral

BAD = """\
roles:
  build: {concurrency: 0, colour: red, worker: claude-cde}
  "a\\x1b[31m": {tools: ["Bash(rm"]}
environments:
  gpu: {kind: ray}
"""


def test_config_check_lists_every_problem_and_exits_2(corral: Corral) -> None:
    c = corral
    c.config.write_text(BAD)
    r = c.run("config", "check")
    assert r.returncode == 2, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{c.config}: 5 problems"
    assert lines[1:] == [
        "  roles.build.concurrency: must be at least 1",
        lines[2],
        "  roles.build.worker: unknown worker kind 'claude-cde' (did you mean 'claude-code'? "
        "known: claude-code, codex, command, opencode)",
        "  roles.a\\x1b[31m.tools: tool scope rule 'Bash(rm': missing `)`",
        "  environments.gpu.address: a ray environment needs the cluster address",
    ]
    assert lines[2].startswith("  roles.build.colour: unknown key (known: ")
    assert "\x1b" not in r.stdout
    found = json.loads(c.run("config", "check", "--json").stdout)
    assert found["ok"] is False and found["source"] == str(c.config)
    assert len(found["problems"]) == 5
    # every other command refuses the file, naming every problem on one line
    r = c.run("jobs")
    assert r.returncode == 2 and "5 problems: roles.build.concurrency" in r.stderr


def test_config_check_of_a_good_file_and_of_none(corral: Corral, tmp_path: Path) -> None:
    c = corral
    assert c.run("config", "check").stdout == f"{c.config}: no problems\n"
    missing = tmp_path / "nowhere.yaml"
    r = c.run("config", "check", "--config", str(missing))
    assert r.returncode == 2 and f"config file not found: {missing}" in r.stderr


def test_init_writes_a_starter_and_refuses_to_overwrite_it(corral: Corral, tmp_path: Path) -> None:
    c = corral
    target = tmp_path / "fresh"
    r = c.run("init", str(target))
    assert r.returncode == 0, r.stderr
    written = target / "corral.yaml"
    assert r.stdout.startswith(f"wrote {written}")
    assert c.run("config", "check", "--config", str(written)).returncode == 0
    written.write_text("# mine\n")
    r = c.run("init", str(target))
    assert r.returncode == 5 and "exists already (--force writes over it)" in r.stderr
    assert written.read_text() == "# mine\n"
    assert c.run("init", str(target), "--force").returncode == 0
    assert written.read_text().startswith("# Example corral.yaml")
