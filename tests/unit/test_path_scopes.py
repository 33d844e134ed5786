"""Path scopes: every file a call touches — through any CLI's file tools or a shell redirection —
is resolved (symlinks, `..`) in the attempt's workspace and must lie within the role's patterns.
Real files and links in a temporary directory, the engine's real resolver."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from corral.domain.models import Limits
from corral.policy.paths import file_uses, parse_path_pattern
from corral.policy.scopes import Call, Scope, Usage, decide

FRESH = Usage(tool_calls=0, tokens_in=0, tokens_out=0)
LIMITS = Limits(max_tool_calls=100)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with a source tree, a link out to /etc, a link within, and a sibling."""
    work = tmp_path / "work"
    (work / "src" / "pkg").mkdir(parents=True)
    (work / "docs").mkdir()
    (work / "src" / "main.py").write_text("print(1)\n")
    (work / "etc").symlink_to("/etc")
    (work / "code").symlink_to(work / "src")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("s")
    (work / "leak.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    (tmp_path / "data").mkdir()
    (tmp_path / "datalink").symlink_to(tmp_path / "data")
    return work


def run(
    ws: Path,
    rules: list[str],
    tool: str,
    tool_input: dict[str, Any],
    cwd: Path | None = None,
    shell: str = "bash",
) -> tuple[bool, str]:
    call = Call(
        tool=tool,
        input=tool_input,
        workspace=str(ws),
        cwd=str(cwd or ws),
        home=str(ws.parent / "home"),
        shell=shell,
    )
    d = decide(call, FRESH, LIMITS, Scope.parse(rules), os.path.realpath)
    return d.verdict == "allow", d.message


# --------------------------------------------------------------------------------------------
# File tools of every CLI
# --------------------------------------------------------------------------------------------

READS = [
    # (tool, input, allowed with a bare `Read`-like rule, i.e. the workspace)
    ("Read", {"file_path": "src/main.py"}, True),
    ("Read", {"file_path": "{ws}/src/main.py"}, True),
    ("Read", {"file_path": "/etc/passwd"}, False),
    ("Read", {"file_path": "../outside/secret.txt"}, False),
    ("Read", {"file_path": "src/../../outside/secret.txt"}, False),
    ("Read", {"file_path": "etc/passwd"}, False),  # a link in the workspace leads out
    ("Read", {"file_path": "leak.txt"}, False),  # so does a link to a file
    ("Read", {"file_path": "code/main.py"}, True),  # a link that stays inside is fine
    ("Read", {"file_path": "~/.ssh/id_rsa"}, False),  # the CLI's home is not the workspace
    ("Read", {"file_path": "src/missing/../main.py"}, True),
    ("Read", {}, False),
    ("read", {"filePath": "src/main.py"}, True),  # OpenCode
    ("read", {"filePath": "/etc/hosts"}, False),
    ("NotebookRead", {"notebook_path": "/tmp/x.ipynb"}, False),
    ("Glob", {"pattern": "**/*.py"}, True),
    ("Glob", {"pattern": "/etc/*"}, False),
    ("Glob", {"pattern": "*.py", "path": "/etc"}, False),
    ("Glob", {"pattern": "../outside/*"}, False),
    ("Glob", {"pattern": "src/*/../../../outside/*"}, False),
    ("glob", {"pattern": "*.py", "path": "src"}, True),  # OpenCode
    ("Grep", {"pattern": "root", "path": "/etc"}, False),
    ("Grep", {"pattern": "x"}, True),  # the cwd by default
    ("grep", {"pattern": "x", "path": "src", "include": "*.py"}, True),
    ("LS", {"path": "/"}, False),
    ("list", {"path": "docs"}, True),  # OpenCode
    ("view_image", {"path": "/root/shot.png"}, False),  # Codex
]


@pytest.mark.parametrize(("tool", "tool_input", "ok"), READS)
def test_reads_stay_in_the_workspace(
    ws: Path, tool: str, tool_input: dict[str, Any], ok: bool
) -> None:
    tool_input = {k: v.replace("{ws}", str(ws)) for k, v in tool_input.items()}
    allowed, message = run(ws, [tool], tool, tool_input)
    assert allowed is ok, message
    if not ok and tool_input:
        assert "outside this role's" in message or "cannot" in message or "climbs" in message


PATCH = "*** Begin Patch\n{body}\n*** End Patch"

WRITES = [
    # (tool, input, allowed by `Write(src/**)` + `Edit(src/**)`)
    ("Write", {"file_path": "src/new.py", "content": "x"}, True),
    ("Write", {"file_path": "src/pkg/deep/new.py", "content": "x"}, True),
    ("Write", {"file_path": "docs/x.md", "content": "x"}, False),
    ("Write", {"file_path": "/tmp/x", "content": "x"}, False),
    ("Write", {"file_path": "code/new.py", "content": "x"}, True),  # code -> src
    ("Edit", {"file_path": "src/main.py", "old_string": "1", "new_string": "2"}, True),
    ("Edit", {"file_path": "etc/hosts", "old_string": "a", "new_string": "b"}, False),
    ("MultiEdit", {"file_path": "src/main.py", "edits": []}, True),
    ("NotebookEdit", {"notebook_path": "nb.ipynb", "new_source": "x"}, False),
    ("write", {"filePath": "src/o.py", "content": "x"}, True),  # OpenCode
    ("edit", {"filePath": "/etc/passwd", "oldString": "a", "newString": "b"}, False),
    ("apply_patch", {"command": PATCH.format(body="*** Add File: src/a.py\n+x")}, True),  # Codex
    ("apply_patch", {"command": PATCH.format(body="*** Add File: ../a.py\n+x")}, False),
    (
        "apply_patch",
        {
            "command": PATCH.format(
                body="*** Update File: src/main.py\n*** Move to: /tmp/main.py\n@@\n-1\n+2"
            )
        },
        False,
    ),
    ("apply_patch", {"command": PATCH.format(body="*** Delete File: docs/x.md")}, False),
    ("apply_patch", {"patchText": PATCH.format(body="*** Add File: src/b.py\n+x")}, True),
    ("apply_patch", {"command": "not a patch"}, False),
    ("patch", {"patchText": PATCH.format(body="*** Add File: /root/.bashrc\n+x")}, False),
]


@pytest.mark.parametrize(("tool", "tool_input", "ok"), WRITES)
def test_writes_stay_where_the_scope_says(
    ws: Path, tool: str, tool_input: dict[str, Any], ok: bool
) -> None:
    allowed, message = run(
        ws,
        ["Write(src/**)", "Edit(src/**)", "NotebookEdit(src/**)", "MultiEdit(src/**)"],
        tool,
        tool_input,
    )
    assert allowed is ok, message


def test_absolute_patterns_name_exactly_that_place(ws: Path) -> None:
    data = ws.parent / "data"
    (data / "a.csv").write_text("1")
    rules = [f"Read({data}/*.csv)", "Read(./**)"]
    assert run(ws, rules, "Read", {"file_path": str(data / "a.csv")})[0]
    assert not run(ws, rules, "Read", {"file_path": str(data / "a.json")})[0]
    # the pattern's own links are resolved too: the same file by the link's name
    assert run(
        ws, [f"Read({ws.parent}/datalink/*.csv)"], "Read", {"file_path": str(data / "a.csv")}
    )[0]
    assert run(ws, rules, "Read", {"file_path": "src/main.py"})[0]


def test_a_bare_rule_means_the_workspace_and_a_role_without_one_gets_nothing(ws: Path) -> None:
    assert run(ws, ["Read"], "Read", {"file_path": "src/main.py"})[0]
    allowed, message = run(ws, ["Read"], "Write", {"file_path": "src/main.py", "content": "x"})
    assert not allowed and "outside this role's tool scope" in message
    assert run(ws, ["Write(/tmp/**)"], "Write", {"file_path": "/tmp/x"})[0]


def test_relative_paths_resolve_where_the_call_runs(ws: Path) -> None:
    # Codex runs an exec_command in its `workdir`; the hook reports it as the call's cwd
    assert not run(ws, ["Read"], "Read", {"file_path": "../../outside/secret.txt"}, cwd=ws / "src")[
        0
    ]
    assert run(ws, ["Read"], "Read", {"file_path": "main.py"}, cwd=ws / "src")[0]
    assert not run(ws, ["Read"], "Read", {"file_path": "x"}, cwd=ws.parent / "outside")[0]


# --------------------------------------------------------------------------------------------
# Shell redirections are reads and writes too
# --------------------------------------------------------------------------------------------

REDIRECTS = [
    # (command, allowed with Bash(kubectl *), Read(./**), Write(out/**))
    ("kubectl get pods > out/pods.txt", True),
    ("kubectl get pods >> out/log.txt 2>&1", True),
    ("kubectl get pods > pods.txt", False),  # Write covers out/ only
    ("kubectl get pods > ~/.bashrc", False),
    ("kubectl get pods > /etc/profile", False),
    ("kubectl get pods > out/../../outside/x", False),
    ("kubectl get pods > etc/motd", False),  # through the link to /etc
    ("kubectl get pods 2> /dev/null", True),
    ("kubectl get pods > /dev/null 2>&1 < /dev/null", True),
    ("kubectl get pods &> out/all.txt", True),
    ("kubectl apply -f - < src/main.py", True),
    ("kubectl apply -f - < /etc/shadow", False),
    ("kubectl get pods | kubectl apply -f - > out/x", True),
    ("cd out && kubectl get pods > x", False),  # relative after cd: cannot be placed
    ('kubectl get pods > "$HOME/x"', False),
]


@pytest.mark.parametrize(("command", "ok"), REDIRECTS)
def test_redirections_are_held_to_the_path_rules(ws: Path, command: str, ok: bool) -> None:
    (ws / "out").mkdir()
    allowed, message = run(
        ws,
        ["Bash(kubectl *)", "Bash(cd *)", "Read(./**)", "Write(out/**)"],
        "Bash",
        {"command": command},
    )
    assert allowed is ok, message
    if not ok and ">" in command and "$" not in command and "cd" not in command:
        assert "redirection" in message, message


def test_a_role_without_file_rules_may_only_redirect_to_devices(ws: Path) -> None:
    rules = ["Bash(kubectl *)"]
    assert run(ws, rules, "Bash", {"command": "kubectl get pods >/dev/null 2>&1"})[0]
    allowed, message = run(ws, rules, "Bash", {"command": "kubectl get pods > pods.txt"})
    assert not allowed and "write scope (allowed: nothing)" in message


def test_redirections_inside_carried_commands_count(ws: Path) -> None:
    rules = ["Bash(kubectl *)", "Bash(bash -c *)", "Write(out/**)"]
    assert not run(ws, rules, "Bash", {"command": "bash -c 'kubectl get pods > /etc/x'"})[0]
    assert run(ws, rules, "Bash", {"command": "bash -c 'kubectl get pods > out/x'"})[0]


def test_claude_codes_run_in_background_is_detaching(ws: Path) -> None:
    call = {"command": "kubectl logs -f web", "run_in_background": True}
    allowed, message = run(ws, ["Bash(kubectl *)"], "Bash", call)
    assert not allowed and "detached" in message
    assert run(ws, ["Bash(kubectl logs * &)"], "Bash", call)[0]


def test_a_shell_the_checker_does_not_model_is_refused(ws: Path) -> None:
    allowed, message = run(
        ws, ["Bash(kubectl *)"], "Bash", {"command": "kubectl get pods"}, shell="zsh"
    )
    assert not allowed and "does not model" in message
    allowed, message = run(
        ws,
        ["Bash(kubectl *)"],
        "Bash",
        {"command": "kubectl get pods &>/dev/null kubectl delete pod x"},
        shell="sh",
    )
    assert not allowed and "bash syntax" in message


# --------------------------------------------------------------------------------------------
# Patterns and uses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "must not be empty"),
        ("~/x", "write the home directory out"),
        ("src/../x", "must not contain `..`"),
        ("a\nb", "control character"),
    ],
)
def test_bad_path_patterns(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_path_pattern(text)


def test_file_uses_name_every_path_of_a_patch() -> None:
    uses, problem = file_uses(
        "apply_patch",
        {
            "command": PATCH.format(
                body="*** Add File: a\n+x\n*** Update File: b\n*** Move to: c\n@@\n-1\n+2\n"
                "*** Delete File: d"
            )
        },
    )
    assert problem is None
    assert [(u.path, u.access) for u in uses] == [
        ("a", "write"),
        ("b", "write"),
        ("c", "write"),
        ("d", "write"),
    ]
    with pytest.raises(KeyError):
        file_uses("WebFetch", {})
