"""The real pinned agent CLIs, run headless against the loopback mocks of their model APIs.

The CLIs are installed by ``scripts/agent-clis`` (run once per module when needed; a failed
install fails the tests, it does not skip them). Each run gets a fresh private HOME and config
dirs, a temp work dir and ``stdin=/dev/null``. What is asserted here is what was observed with
Claude Code 2.1.330, Codex 0.169.0 and OpenCode 1.18.33: tool calls really run, a PreToolUse
hook (Claude, Codex) or a ``tool.execute.before`` plugin (OpenCode) can block them, what a
missing / crashing hook does, and that resuming a session resends the earlier conversation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.agentmock import AnthropicMock, MockServer, OpenAIResponsesMock

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CLAUDE_MODEL = "claude-sonnet-4-5"
# A slug Codex 0.169.0 has metadata for: plain function tools + the freeform apply_patch tool.
# (An unknown slug such as "gpt-5" also works but warns and offers no apply_patch tool.)
CODEX_MODEL = "gpt-5.5"
OPENCODE_MODEL = "openai/gpt-5"
MAKE_FILE = [
    {"text": "creating", "tool_calls": [{"name": "Bash", "input": {"command": "touch made.txt"}}]}
]


# ---------------------------------------------------------------------------------------------
# installation and process helpers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clis() -> dict[str, str]:
    """Absolute paths of the pinned ``claude``, ``codex`` and ``opencode`` binaries."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "agent-clis")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/agent-clis failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    paths = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert set(paths) == {"claude", "codex", "opencode"}, proc.stdout
    return paths


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 90) -> Run:
    """Run a CLI in its own session; on timeout kill its whole process group."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        msg = f"{argv[0]} timed out after {timeout}s\nstdout:{out}\nstderr:{err}"
        raise AssertionError(msg) from None
    return Run(proc.returncode, out, err)


class Run:
    def __init__(self, rc: int, stdout: str, stderr: str) -> None:
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]

    def __repr__(self) -> str:
        return f"Run(rc={self.rc}, stdout={self.stdout[-3000:]!r}, stderr={self.stderr[-3000:]!r})"


def base_env(root: Path) -> dict[str, str]:
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}


def write_hook(path: Path, log: Path, mode: str) -> Path:
    """A command hook: logs its stdin payload + env, then allows / denies / fails per ``mode``.

    Modes: ``allow``; ``deny`` (Claude/Codex JSON decision); ``exit2`` (stderr = reason);
    ``exit1`` (a crash).
    """
    path.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import json, os, sys
            payload = json.load(sys.stdin)
            with open({str(log)!r}, "a") as f:
                f.write(json.dumps({{"stdin": payload, "env": dict(os.environ),
                                     "cwd": os.getcwd()}}) + "\\n")
            mode = {mode!r}
            if mode == "deny":
                print(json.dumps({{"hookSpecificOutput": {{"hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": "corral policy: no"}}}}))
            elif mode == "exit2":
                print("corral policy: no (exit 2)", file=sys.stderr)
                sys.exit(2)
            elif mode == "exit1":
                print("hook crashed", file=sys.stderr)
                sys.exit(1)
            """
        )
    )
    path.chmod(0o755)
    return path


def hook_log(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def texts_in(body: Any) -> str:
    """All of a request body as one string, for 'does the history contain X' checks."""
    return json.dumps(body)


# ---------------------------------------------------------------------------------------------
# per-CLI harnesses
# ---------------------------------------------------------------------------------------------


class Claude:
    """``claude -p`` against an AnthropicMock; ANTHROPIC_BASE_URL + a private CLAUDE_CONFIG_DIR."""

    def __init__(self, bin_path: str, root: Path, mock: MockServer) -> None:
        self.bin, self.root, self.mock = bin_path, root, mock
        self.wd = root / "wd"
        self.wd.mkdir(parents=True, exist_ok=True)
        self.env = base_env(root) | {
            "CLAUDE_CONFIG_DIR": str(root / "claude-config"),
            "ANTHROPIC_BASE_URL": mock.url,
            "ANTHROPIC_API_KEY": "sk-ant-mock",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }

    def run(self, prompt: str, *extra: str, settings: dict[str, Any] | None = None) -> Run:
        argv = [self.bin, "-p", prompt, "--output-format", "stream-json", "--verbose"]
        argv += ["--model", CLAUDE_MODEL, "--allowedTools", "Bash", "--setting-sources", ""]
        if settings is not None:
            argv += ["--settings", json.dumps(settings)]
        return run([*argv, *extra], self.wd, self.env)

    @staticmethod
    def hook_settings(command: str, on_failure: str | None = "block") -> dict[str, Any]:
        handler: dict[str, Any] = {"type": "command", "command": command, "timeout": 10}
        if on_failure:
            handler["onFailure"] = on_failure
        return {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [handler]}]}}

    @staticmethod
    def tool_results(r: Run) -> list[dict[str, Any]]:
        return [
            block
            for e in r.events
            if e["type"] == "user"
            for block in e["message"]["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]

    @staticmethod
    def tool_uses(r: Run) -> list[dict[str, Any]]:
        return [
            block
            for e in r.events
            if e["type"] == "assistant"
            for block in e["message"]["content"]
            if block.get("type") == "tool_use"
        ]

    @staticmethod
    def result(r: Run) -> dict[str, Any]:
        results = [e for e in r.events if e["type"] == "result"]
        assert results, r
        return results[-1]


class Codex:
    """``codex exec --json`` against an OpenAIResponsesMock via a ``model_providers`` entry."""

    def __init__(self, bin_path: str, root: Path, mock: MockServer) -> None:
        self.bin, self.root, self.mock = bin_path, root, mock
        self.wd = root / "wd"
        self.wd.mkdir(parents=True, exist_ok=True)
        self.home = root / "codex-home"
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            textwrap.dedent(
                f"""\
                model = "{CODEX_MODEL}"
                model_provider = "mock"

                [model_providers.mock]
                name = "mock"
                base_url = "{mock.url}/v1"
                env_key = "MOCK_OPENAI_API_KEY"
                wire_api = "responses"
                """
            )
        )
        self.env = base_env(root) | {"CODEX_HOME": str(self.home), "MOCK_OPENAI_API_KEY": "sk-mock"}

    def set_hook(self, command: str) -> None:
        handler = {"type": "command", "command": command, "timeout": 10}
        hooks = {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [handler]}]}}
        (self.home / "hooks.json").write_text(json.dumps(hooks))

    def flags(self) -> list[str]:
        return ["--json", "--skip-git-repo-check", "--dangerously-bypass-hook-trust"]

    def run(self, prompt: str) -> Run:
        argv = [self.bin, "exec", *self.flags(), "--sandbox", "workspace-write", prompt]
        return run(argv, self.wd, self.env)

    def resume(self, thread_id: str, prompt: str) -> Run:
        return run(
            [self.bin, "exec", "resume", *self.flags(), thread_id, prompt], self.wd, self.env
        )

    @staticmethod
    def items(r: Run, kind: str) -> list[dict[str, Any]]:
        return [
            e["item"]
            for e in r.events
            if e["type"] == "item.completed" and e["item"]["type"] == kind
        ]


GUARD_PLUGIN = """\
// Corral guard: hand every tool call to an external command (payload on stdin, JSON);
// exit 0 = allow, anything else (or failing to start it) = block, stderr = reason.
import { spawnSync } from "node:child_process";
const HOOK = %(hook)s;
export const CorralGuard = async (ctx) => ({
  "tool.execute.before": async (input, output) => {
    const payload = JSON.stringify({
      hook_event_name: "PreToolUse", tool_name: input.tool, tool_input: output.args,
      session_id: input.sessionID, tool_use_id: input.callID, cwd: ctx.directory,
    });
    const r = spawnSync(HOOK, [], { input: payload, encoding: "utf8", timeout: 30000 });
    if (r.error || r.status !== 0) {
      const why = (r.stderr || "").trim() || String(r.error || "exit " + r.status);
      throw new Error("blocked by corral hook: " + why);
    }
  },
});
"""


class OpenCode:
    """``opencode run --format json`` with all config under private XDG dirs (none in the wd)."""

    def __init__(self, bin_path: str, root: Path, mock: MockServer) -> None:
        self.bin, self.root, self.mock = bin_path, root, mock
        self.wd = root / "wd"
        self.wd.mkdir(parents=True, exist_ok=True)
        xdg = {
            name: root / name.lower()
            for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")
        }
        for path in xdg.values():
            path.mkdir(parents=True, exist_ok=True)
        self.config_dir = xdg["XDG_CONFIG_HOME"] / "opencode"
        self.config_dir.mkdir(exist_ok=True)
        # OpenCode `npm install`s @opencode-ai/plugin into every config dir at start-up (and
        # waits for it when plugins are configured: ~7 s and network). Its check is skipped
        # when node_modules exists and package.json's deps are all in package-lock.json.
        (self.config_dir / "node_modules").mkdir(exist_ok=True)
        dep = {"@opencode-ai/plugin": "1.18.33"}
        (self.config_dir / "package.json").write_text(json.dumps({"dependencies": dep}))
        lock = {"lockfileVersion": 3, "packages": {"": {"dependencies": dep}}}
        (self.config_dir / "package-lock.json").write_text(json.dumps(lock))
        self.config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": OPENCODE_MODEL,
            "provider": {"openai": {"options": {"baseURL": f"{mock.url}/v1", "apiKey": "sk-mock"}}},
            "permission": {"bash": "allow", "edit": "allow"},
        }
        self.env = (
            base_env(root)
            | {k: str(v) for k, v in xdg.items()}
            | {
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            }
        )

    def set_plugin(self, source: str) -> None:
        plugin_dir = self.config_dir / "plugin"
        plugin_dir.mkdir(exist_ok=True)
        (plugin_dir / "corral-guard.js").write_text(source)

    def run(self, prompt: str, *extra: str) -> Run:
        (self.config_dir / "opencode.json").write_text(json.dumps(self.config))
        argv = [self.bin, "run", "--format", "json", "-m", OPENCODE_MODEL, *extra, prompt]
        return run(argv, self.wd, self.env)

    @staticmethod
    def tool_uses(r: Run) -> list[dict[str, Any]]:
        return [e["part"] for e in r.events if e["type"] == "tool_use"]


# ---------------------------------------------------------------------------------------------
# the mocks on their own
# ---------------------------------------------------------------------------------------------


def _post(url: str, body: dict[str, Any], timeout: float = 5) -> str:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(resp.read().decode())


def test_mock_script_semantics_loop_aux_and_hang() -> None:
    tools = [{"name": "Bash", "input_schema": {}}]
    script = [
        {"text": "one", "usage": {"input_tokens": 7, "output_tokens": 123456}},
        {
            "tool_calls": [{"name": "Bash", "input": {"command": f"echo {i}"}} for i in range(3)],
            "loop": True,
        },
    ]
    with AnthropicMock(script) as m:
        url = f"{m.url}/v1/messages?beta=true"
        first = _post(url, {"stream": True, "tools": tools, "messages": []})
        assert '"output_tokens": 123456' in first and "one" in first
        aux = _post(url, {"stream": True, "messages": [{"role": "user", "content": "title?"}]})
        assert "message_stop" in aux
        for _ in range(3):  # the loop turn repeats forever: a storm of 3 calls each time
            assert (
                _post(url, {"stream": True, "tools": tools}).count(
                    '"content_block": {"type": "tool_use"'
                )
                == 3
            )
        assert m.turns_consumed == 1 and len(m.aux_requests) == 1 and len(m.turn_requests) == 4
    hung = [{"hang": True}]
    with OpenAIResponsesMock(hung, dialect="opencode") as m2:
        errors: list[BaseException] = []

        def call() -> None:
            try:
                _post(f"{m2.url}/v1/responses", {"tools": [{"name": "bash"}]}, timeout=30)
            except BaseException as e:  # the connection is dropped at close()
                errors.append(e)

        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 5
        while not m2.turn_requests and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
    assert time.monotonic() - started < 3, "close() blocked on a hung request"
    t.join(5)
    assert errors and not t.is_alive()
    with OpenAIResponsesMock([], dialect="codex") as m3:
        done = _post(f"{m3.url}/v1/responses", {"tools": [{"name": "exec_command"}]})
        assert '"text": "done"' in done and "response.completed" in done


def test_a_status_turn_is_an_api_error_in_the_apis_own_shape() -> None:
    tools = [{"name": "Bash", "input_schema": {}}]
    with AnthropicMock(
        [{"status": 401, "message": "invalid x-api-key"}, {"status": 529, "loop": True}]
    ) as m:
        url = f"{m.url}/v1/messages?beta=true"
        for status, kind in (
            (401, "authentication_error"),
            (529, "overloaded_error"),
            (529, "overloaded_error"),
        ):
            with pytest.raises(urllib.error.HTTPError) as err:
                _post(url, {"stream": True, "tools": tools})
            assert err.value.code == status
            assert json.loads(err.value.read())["error"]["type"] == kind
    with OpenAIResponsesMock([{"status": 429}], dialect="codex") as m2:
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(f"{m2.url}/v1/responses", {"tools": [{"name": "exec_command"}]})
        assert err.value.code == 429
        assert json.loads(err.value.read())["error"]["message"] == "mock 429"
        assert '"text": "done"' in _post(
            f"{m2.url}/v1/responses", {"tools": [{"name": "exec_command"}]}
        )


# ---------------------------------------------------------------------------------------------
# Claude Code
# ---------------------------------------------------------------------------------------------


def test_claude_bash_tool_runs(clis: dict[str, str], tmp_path: Path) -> None:
    with AnthropicMock(MAKE_FILE) as mock:
        cc = Claude(clis["claude"], tmp_path, mock)
        r = cc.run("make a file")
    assert r.rc == 0, r
    assert (cc.wd / "made.txt").exists()
    assert [u["name"] for u in Claude.tool_uses(r)] == ["Bash"]
    assert [t.get("is_error") for t in Claude.tool_results(r)] == [False]
    assert Claude.result(r)["subtype"] == "success"
    assert len(mock.turn_requests) == 2  # tool turn + final "done"; no side calls observed
    assert all(req.get("tools") for req in mock.turn_requests)


@pytest.mark.parametrize("mode", ["deny", "exit2"])
def test_claude_pretooluse_hook_blocks(clis: dict[str, str], tmp_path: Path, mode: str) -> None:
    log = tmp_path / "hook.jsonl"
    hook = write_hook(tmp_path / "hook.py", log, mode)
    with AnthropicMock(MAKE_FILE) as mock:
        cc = Claude(clis["claude"], tmp_path, mock)
        r = cc.run("make a file", settings=Claude.hook_settings(str(hook)))
    assert r.rc == 0, r
    assert not (cc.wd / "made.txt").exists()
    [result] = Claude.tool_results(r)
    assert result["is_error"] is True
    assert result["content"].startswith("PreToolUse:Bash hook error: ")
    assert "corral policy: no" in result["content"]
    denials = Claude.result(r)["permission_denials"]
    assert [d["tool_name"] for d in denials] == ["Bash"]
    [call] = hook_log(log)
    payload, env = call["stdin"], call["env"]
    assert payload["hook_event_name"] == "PreToolUse"
    assert payload["tool_name"] == "Bash"
    assert payload["tool_input"]["command"] == "touch made.txt"
    assert payload["cwd"] == str(cc.wd) == env["CLAUDE_PROJECT_DIR"] == call["cwd"]
    assert env["CLAUDE_CODE_SESSION_ID"] == payload["session_id"]
    # the hook inherits the CLI's env, API key included
    assert env["ANTHROPIC_API_KEY"] == "sk-ant-mock"


@pytest.mark.parametrize(
    ("failure", "on_failure", "blocked"),
    [
        ("missing", None, False),  # fail OPEN by default
        ("missing", "block", True),
        ("exit1", None, False),
        ("exit1", "block", True),
    ],
)
def test_claude_broken_hook(
    clis: dict[str, str], tmp_path: Path, failure: str, on_failure: str | None, blocked: bool
) -> None:
    if failure == "missing":
        command = str(tmp_path / "no-such-hook")
    else:
        command = str(write_hook(tmp_path / "hook.py", tmp_path / "hook.jsonl", "exit1"))
    with AnthropicMock(MAKE_FILE) as mock:
        cc = Claude(clis["claude"], tmp_path, mock)
        r = cc.run("make a file", settings=Claude.hook_settings(command, on_failure))
    assert r.rc == 0, r
    assert (cc.wd / "made.txt").exists() is not blocked
    [result] = Claude.tool_results(r)
    assert bool(result.get("is_error")) is blocked
    if blocked:
        assert 'blocking because onFailure is "block"' in result["content"]


def test_claude_resume_sends_history(clis: dict[str, str], tmp_path: Path) -> None:
    with AnthropicMock(MAKE_FILE) as mock:
        cc = Claude(clis["claude"], tmp_path, mock)
        first = cc.run("first prompt: make a file")
        session = Claude.result(first)["session_id"]
        [tool_use] = Claude.tool_uses(first)
        n = len(mock.turn_requests)
        second = cc.run("second prompt", "--resume", session)
    assert first.rc == 0 and second.rc == 0, (first, second)
    assert Claude.result(second)["session_id"] == session
    req = texts_in(mock.turn_requests[n])
    for needle in ("first prompt: make a file", tool_use["id"], "creating", "second prompt"):
        assert needle in req
    transcript = tmp_path / "claude-config" / "projects"
    assert list(transcript.glob(f"*/{session}.jsonl"))


# ---------------------------------------------------------------------------------------------
# Codex CLI
# ---------------------------------------------------------------------------------------------


def test_codex_shell_and_apply_patch_run(clis: dict[str, str], tmp_path: Path) -> None:
    script = [
        *MAKE_FILE,
        {"tool_calls": [{"name": "Write", "input": {"file_path": "patched.txt", "content": "hi"}}]},
    ]
    with OpenAIResponsesMock(script, dialect="codex") as mock:
        cx = Codex(clis["codex"], tmp_path, mock)
        r = cx.run("make a file")
    assert r.rc == 0, r
    assert (cx.wd / "made.txt").exists()
    assert (cx.wd / "patched.txt").read_text() == "hi\n"
    [cmd] = Codex.items(r, "command_execution")
    assert cmd["command"] == "/bin/bash -lc 'touch made.txt'" and cmd["exit_code"] == 0
    [change] = Codex.items(r, "file_change")
    assert change["changes"] == [{"path": str(cx.wd / "patched.txt"), "kind": "add"}]
    assert [e["type"] for e in r.events][-1] == "turn.completed"
    offered = {t.get("name") for t in mock.turn_requests[0]["tools"]}
    assert {"exec_command", "apply_patch"} <= offered


@pytest.mark.parametrize("mode", ["deny", "exit2"])
def test_codex_pretooluse_hook_blocks(clis: dict[str, str], tmp_path: Path, mode: str) -> None:
    log = tmp_path / "hook.jsonl"
    script = [
        *MAKE_FILE,
        {"tool_calls": [{"name": "Write", "input": {"file_path": "patched.txt", "content": "hi"}}]},
    ]
    with OpenAIResponsesMock(script, dialect="codex") as mock:
        cx = Codex(clis["codex"], tmp_path, mock)
        cx.set_hook(str(write_hook(tmp_path / "hook.py", log, mode)))
        r = cx.run("make a file")
    assert r.rc == 0, r
    assert not (cx.wd / "made.txt").exists()
    assert not (cx.wd / "patched.txt").exists()
    # blocked calls leave no item in the stream; only the model sees the refusal
    assert Codex.items(r, "command_execution") == [] and Codex.items(r, "file_change") == []
    outputs = [
        item["output"]
        for item in mock.turn_requests[-1]["input"]
        if item.get("type") in ("function_call_output", "custom_tool_call_output")
    ]
    assert len(outputs) == 2
    assert all(
        o.startswith("Command blocked by PreToolUse hook: corral policy: no") for o in outputs
    )
    calls = hook_log(log)
    assert [(c["stdin"]["tool_name"], c["stdin"]["tool_input"]) for c in calls] == [
        ("Bash", {"command": "touch made.txt"}),
        (
            "apply_patch",
            {"command": "*** Begin Patch\n*** Add File: patched.txt\n+hi\n*** End Patch"},
        ),
    ]
    env = calls[0]["env"]
    assert calls[0]["cwd"] == str(cx.wd) == calls[0]["stdin"]["cwd"]
    assert env["CODEX_HOME"] == str(cx.home)
    assert "CLAUDE_PROJECT_DIR" not in env


@pytest.mark.parametrize("failure", ["missing", "exit1"])
def test_codex_broken_hook_fails_open(clis: dict[str, str], tmp_path: Path, failure: str) -> None:
    with OpenAIResponsesMock(MAKE_FILE, dialect="codex") as mock:
        cx = Codex(clis["codex"], tmp_path, mock)
        if failure == "missing":
            cx.set_hook(str(tmp_path / "no-such-hook"))
        else:
            cx.set_hook(str(write_hook(tmp_path / "hook.py", tmp_path / "hook.jsonl", "exit1")))
        r = cx.run("make a file")
    assert r.rc == 0, r
    assert (cx.wd / "made.txt").exists()  # no onFailure knob: a broken hook lets the call run
    assert len(Codex.items(r, "command_execution")) == 1


def test_codex_resume_sends_history(clis: dict[str, str], tmp_path: Path) -> None:
    with OpenAIResponsesMock(MAKE_FILE, dialect="codex") as mock:
        cx = Codex(clis["codex"], tmp_path, mock)
        first = cx.run("first prompt: make a file")
        [thread_id] = [e["thread_id"] for e in first.events if e["type"] == "thread.started"]
        n = len(mock.turn_requests)
        second = cx.resume(thread_id, "second prompt")
    assert first.rc == 0 and second.rc == 0, (first, second)
    assert [e["thread_id"] for e in second.events if e["type"] == "thread.started"] == [thread_id]
    req = texts_in(mock.turn_requests[n])
    for needle in ("first prompt: make a file", "touch made.txt", "creating", "second prompt"):
        assert needle in req
    first_usage = [e["usage"] for e in first.events if e["type"] == "turn.completed"][-1]
    second_usage = [e["usage"] for e in second.events if e["type"] == "turn.completed"][-1]
    assert second_usage["input_tokens"] > first_usage["input_tokens"]  # cumulative per thread


# ---------------------------------------------------------------------------------------------
# OpenCode
# ---------------------------------------------------------------------------------------------


def test_opencode_bash_tool_runs(clis: dict[str, str], tmp_path: Path) -> None:
    with OpenAIResponsesMock(MAKE_FILE, dialect="opencode") as mock:
        oc = OpenCode(clis["opencode"], tmp_path, mock)
        r = oc.run("make a file")
    assert r.rc == 0, r
    assert (oc.wd / "made.txt").exists()
    assert sorted(p.name for p in oc.wd.iterdir()) == ["made.txt"]  # no config in the wd
    [use] = OpenCode.tool_uses(r)
    assert use["tool"] == "bash" and use["state"]["status"] == "completed"
    assert use["state"]["input"]["command"] == "touch made.txt"
    assert r.events[-1]["type"] == "step_finish" and r.events[-1]["part"]["reason"] == "stop"
    # the title request to the small model has no tools and did not consume a turn
    assert [a.get("model") for a in mock.aux_requests] == ["gpt-5.4-nano"]
    assert len(mock.turn_requests) == 2


def test_opencode_plugin_blocks_every_tool(clis: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "hook.jsonl"
    hook = write_hook(tmp_path / "hook.py", log, "exit2")
    script = [
        *MAKE_FILE,
        {"tool_calls": [{"name": "Write", "input": {"file_path": "patched.txt", "content": "x"}}]},
        {"tool_calls": [{"name": "Read", "input": {"file_path": str(tmp_path / "hook.py")}}]},
    ]
    with OpenAIResponsesMock(script, dialect="opencode") as mock:
        oc = OpenCode(clis["opencode"], tmp_path, mock)
        oc.set_plugin(GUARD_PLUGIN % {"hook": json.dumps(str(hook))})
        r = oc.run("make a file")
    assert r.rc == 0, r
    assert sorted(p.name for p in oc.wd.iterdir()) == []
    uses = OpenCode.tool_uses(r)
    assert [(u["tool"], u["state"]["status"]) for u in uses] == [
        ("bash", "error"),
        ("apply_patch", "error"),
        ("read", "error"),
    ]
    assert all(
        u["state"]["error"] == "blocked by corral hook: corral policy: no (exit 2)" for u in uses
    )
    calls = [c["stdin"] for c in hook_log(log)]
    assert [c["tool_name"] for c in calls] == ["bash", "apply_patch", "read"]
    assert calls[0]["tool_input"] == {"command": "touch made.txt", "description": "run a command"}
    assert calls[0]["cwd"] == str(oc.wd)


@pytest.mark.parametrize("failure", ["missing-command", "broken-plugin"])
def test_opencode_broken_guard(clis: dict[str, str], tmp_path: Path, failure: str) -> None:
    with OpenAIResponsesMock(MAKE_FILE, dialect="opencode") as mock:
        oc = OpenCode(clis["opencode"], tmp_path, mock)
        if failure == "missing-command":
            oc.set_plugin(GUARD_PLUGIN % {"hook": json.dumps(str(tmp_path / "no-such-hook"))})
        else:
            oc.set_plugin("export const Broken = async () => ({ this is not javascript")
        r = oc.run("make a file")
    assert r.rc == 0, r
    uses = OpenCode.tool_uses(r)
    if failure == "missing-command":
        # our plugin fails closed: spawn error => throw => the call is blocked
        assert not (oc.wd / "made.txt").exists()
        assert uses[0]["state"]["status"] == "error"
        assert "ENOENT" in uses[0]["state"]["error"]
    else:
        # a plugin that does not load is dropped silently (nothing on stderr or in the log at
        # INFO): the run goes on WITHOUT the guard, i.e. fail open
        assert (oc.wd / "made.txt").exists()
        assert uses[0]["state"]["status"] == "completed"


def test_opencode_resume_sends_history(clis: dict[str, str], tmp_path: Path) -> None:
    with OpenAIResponsesMock(MAKE_FILE, dialect="opencode") as mock:
        oc = OpenCode(clis["opencode"], tmp_path, mock)
        first = oc.run("first prompt: make a file")
        [session] = {e["sessionID"] for e in first.events}
        n = len(mock.turn_requests)
        second = oc.run("second prompt", "--session", session)
    assert first.rc == 0 and second.rc == 0, (first, second)
    assert {e["sessionID"] for e in second.events} == {session}
    req = texts_in(mock.turn_requests[n])
    for needle in ("first prompt: make a file", "touch made.txt", "creating", "second prompt"):
        assert needle in req
