"""The model gateway end to end: the real pinned CLIs, pointed at Corral's gateway by a real
`corral serve`, which forwards to a loopback stand-in of the provider's API. The gateway holds the
provider key (the agent never sees it), meters the streamed tokens live and cuts a call that
crosses the attempt's budget, and coalesces identical calls of one job."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.test_agents import CLAUDE
from tests.agentmock import AnthropicMock, MockServer, OpenAIResponsesMock
from tests.helpers import eventually

BIN = Path(CLAUDE).parent
PROVIDER_KEY = "sk-provider-real-7f3a9c2e51d04b8a"


def config(
    kind: str,
    upstream: str,
    *,
    limits: str = "",
    provider_extra: str = "",
    retries: int = 0,
    role_extra: str = "",
    top: str = "",
) -> str:
    gateway = f'gateway: {{upstream: "{upstream}", key_env: PROVIDER_KEY}}'
    workers = {
        "claude-code": f"""
  claude-code:
    binary: {BIN / "claude"}
    version: 2.1.330
    summary_grace_s: 1
    env: {{PROVIDER_KEY: {PROVIDER_KEY}, ANTHROPIC_AUTH_TOKEN: {PROVIDER_KEY}}}
    {gateway}
""",
        "codex": f"""
  codex:
    binary: {BIN / "codex"}
    version: 0.169.0
    model: gpt-5.5
    summary_grace_s: 1
    env: {{PROVIDER_KEY: {PROVIDER_KEY}}}
    {gateway}
    config: {{model_providers: {{corral: {{request_max_retries: {retries}{provider_extra}}}}}}}
""",
        "opencode": f"""
  opencode:
    binary: {BIN / "opencode"}
    version: 1.18.33
    model: openai/gpt-5
    summary_grace_s: 1
    env: {{PROVIDER_KEY: {PROVIDER_KEY}}}
    {gateway}
    config:
      permission: {{bash: allow, edit: allow}}
""",
    }
    return f"""{top}
scheduler:
  poll_interval_s: 0.2
roles:
  default: {{}}
  agent:
    worker: {kind}
    tools: ["Bash(echo *)", "Bash(touch *)"]
    limits: {{max_attempts: 1, timeout_s: 90, grace_s: 2{limits}}}
{role_extra}workers:{workers[kind]}"""


def mock_for(kind: str) -> MockServer:
    if kind == "claude-code":
        return AnthropicMock([])
    return OpenAIResponsesMock([], dialect=kind)


@pytest.fixture
def setup(
    request: pytest.FixtureRequest, tmp_path: Path, clis: None
) -> Iterator[tuple[str, Corral, MockServer]]:
    kind = str(request.param)
    mock = mock_for(kind).start()
    c = Corral(tmp_path, config(kind, mock.url))
    try:
        yield kind, c, mock
    finally:
        c.stop_all()
        mock.close()


def submit(c: Corral, *opts: str) -> str:
    return c.ok(
        "submit", "--role", "agent", "--prompt", "do the task", "--cwd", str(c.work), *opts
    ).strip()


def agent_processes(job: str) -> list[tuple[int, bytes, bytes]]:
    """(pid, environ, argv) of every process of this job's attempt that we may read."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"CORRAL_JOB_ID={job}".encode() in env.split(b"\0"):
            found.append((int(entry.name), env, argv))
    return found


def files_holding(root: Path, needle: bytes) -> list[Path]:
    out = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                out.append(path)
        except OSError:
            continue
    return out


@pytest.mark.parametrize("setup", ["claude-code", "codex", "opencode"], indirect=True)
def test_the_agent_never_holds_the_provider_key(setup: tuple[str, Corral, MockServer]) -> None:
    kind, c, mock = setup
    os.environ.pop("PROVIDER_KEY", None)
    looked = c.work.parent / "looked"  # the CLI waits on its first call until the test looked
    mock.script[:] = [
        {
            "text": "Thinking.",
            "wait_for": str(looked),
            "tool_calls": [{"name": "Bash", "input": {"command": "touch made.txt"}}],
        },
        {"text": "Done: made a file."},
    ]
    c.serve()
    job = submit(c)
    procs = eventually(
        lambda: (
            [p for p in agent_processes(job) if kind.split("-")[0].encode() in p[2]]
            and agent_processes(job)
        ),
        timeout=60,
        what="the agent CLI running",
    )
    eventually(lambda: mock.turn_requests, timeout=60, what="the first model call upstream")
    procs = agent_processes(job)
    assert procs
    for _, env, argv in procs:
        assert PROVIDER_KEY.encode() not in env and PROVIDER_KEY.encode() not in argv
    tokens = {v for _, env, _ in procs for v in env.split(b"\0") if b"cgw1." in v}
    assert tokens  # the CLI holds the gateway's per-attempt token instead
    looked.touch()
    c.wait(job, timeout=120)
    info = c.job(job)
    assert info["state"] == "SUCCEEDED", (info, c.engine_log()[-3000:])
    assert (c.work / "made.txt").exists()  # tool calls still governed and run
    # no file the agent (or Corral for it) wrote holds the key: its home, its attempt
    assert files_holding(c.data / "agent-home", PROVIDER_KEY.encode()) == []
    assert files_holding(c.data / "attempts", PROVIDER_KEY.encode()) == []
    event = c.json("trace", job)["agent_events"][0]
    calls = event["model_calls"]
    assert calls["requests"] >= 2 and calls["upstream_calls"] == len(mock.requests)
    assert event["tokens_in"] >= 200 and event["tokens_out"] >= 40  # as metered
    # the token ended with its attempt
    token = sorted(tokens)[0].split(b"=", 1)[1].decode()
    gateway = json.loads((c.data / "model-gateway.json").read_text())["url"]
    assert token_refused(gateway, token)


def token_refused(gateway: str, token: str) -> bool:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        gateway + "/v1/responses",
        data=b'{"model": "gpt-5"}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, timeout=10).read()
    except urllib.error.HTTPError as e:
        return e.code == 401
    return False


@pytest.mark.parametrize("setup", ["codex"], indirect=True)
def test_a_codex_token_explosion_is_cut_by_the_gateway_at_the_output_budget(
    setup: tuple[str, Corral, MockServer],
) -> None:
    """Codex reports its usage only when its `exec` ends; the gateway counts the output deltas
    as they stream and cuts the call at the budget."""
    _, c, mock = setup
    mock.script[:] = [
        {
            "text": "x" * 1000,
            "repeat": 5000,  # 5,000,000 chars streamed
            "usage": {"input_tokens": 100, "output_tokens": 1_250_000},
            "loop": True,
        }
    ]
    c.serve()
    job = submit(c, "--token-budget-out", "10000")
    c.wait(job, timeout=120)
    info = c.job(job)
    assert info["state"] == "FAILED" and info["limit_hit"] == "token_budget_out", (
        info,
        c.engine_log()[-3000:],
    )
    event: dict[str, Any] = c.json("trace", job)["agent_events"][0]
    assert event["limit_hit"] == "token_budget_out"
    assert 10_000 < event["tokens_out"] < 50_000  # metered live, not 0 and not 1.25 M
    calls = event["model_calls"]
    assert calls["refused"] >= 1 and calls["upstream_calls"] == len(mock.turn_requests) == 1
    assert event["tool_calls"] == []  # no turn ever completed
    shown = c.ok("trace", job)
    assert "model calls" in shown and "through the gateway" in shown


@pytest.mark.parametrize("setup", ["codex"], indirect=True)
def test_a_retried_identical_call_joins_the_one_in_flight(
    setup: tuple[str, Corral, MockServer],
) -> None:
    """The provider is slow; Codex gives up waiting and sends the same call again. The gateway
    does not call the provider twice: the retry gets the answer of the call in flight."""
    _, c, mock = setup
    c.config.write_text(
        config(
            "codex",
            mock.url,
            provider_extra=(", stream_idle_timeout_ms: 1000, stream_max_retries: 5"),
        )
    )
    mock.script[:] = [
        {
            "text": "Slow but here.",
            "stall_s": 3.5,
            "tool_calls": [{"name": "Bash", "input": {"command": "touch once.txt"}}],
        },
        {"text": "Done."},
    ]
    c.serve()
    job = submit(c)
    c.wait(job, timeout=120)
    info = c.job(job)
    event: dict[str, Any] = c.json("trace", job)["agent_events"][0]
    assert info["state"] == "SUCCEEDED", (info, c.engine_log()[-3000:])
    calls = event["model_calls"]
    assert calls["coalesced"] >= 1
    assert calls["upstream_calls"] == len(mock.turn_requests) == 2  # one per distinct call
    assert calls["requests"] == calls["upstream_calls"] + calls["coalesced"]


@pytest.mark.parametrize("setup", ["codex"], indirect=True)
def test_429s_open_the_models_breaker_and_the_role_falls_back(
    setup: tuple[str, Corral, MockServer],
) -> None:
    """The provider rate-limits the role's model: the gateway's breaker for the model opens,
    and the job's retry goes to the role's fallback model without asking for the first one."""
    _, c, mock = setup
    text = (
        config("codex", mock.url, role_extra="    fallback_models: [gpt-5.4-mini]\n", limits="")
        .replace(
            "key_env: PROVIDER_KEY}",
            "key_env: PROVIDER_KEY, breakers: {consecutive_failures: 1, open_s: 600}}",
        )
        .replace("max_attempts: 1,", "max_attempts: 2,")
        .replace("  agent:\n", "  agent:\n    retry: {base_s: 0.05, cap_s: 0.2}\n")
    )
    c.config.write_text(text)
    mock.script[:] = [
        {"status": 429, "message": "Rate limit reached for gpt-5.5"},
        {
            "text": "On the fallback.",
            "tool_calls": [{"name": "Bash", "input": {"command": "touch fb.txt"}}],
        },
        {"text": "Done."},
    ]
    c.serve()
    job = submit(c)
    c.wait(job, timeout=120)
    info = c.job(job)
    assert info["state"] == "SUCCEEDED", (info, c.engine_log()[-3000:])
    assert (c.work / "fb.txt").exists()
    models = [r["model"] for r in mock.turn_requests]
    assert models[0] == "gpt-5.5" and set(models[1:]) == {"gpt-5.4-mini"}, models
    first, second = c.json("trace", job)["agent_events"]
    assert first["model_calls"]["fallbacks"] == 0
    assert second["model_calls"]["fallbacks"] == len(models) - 1 >= 2
    breakers = {b["name"]: b for b in c.json("breakers")}
    assert breakers["model:gpt-5.5"]["state"] == "OPEN"
    assert breakers["model:gpt-5.5"]["scope"] == "gateway"
    assert breakers["model:gpt-5.4-mini"]["state"] == "CLOSED"
    assert breakers["worker:codex"]["state"] == "CLOSED"  # the core's keep their own settings
