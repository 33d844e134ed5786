"""The engine's configuration as it is published (runtime/published.py) and the credentials an
agent CLI can see (workers/credentials.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config import Config, load
from corral.core.ports import EngineConfig
from corral.domain.settings import WorkerSpec
from corral.runtime.published import effective, fingerprint, record, redacted
from corral.workers.credentials import missing

TEXT = """roles:
  notebook: {worker: claude-code, limits: {token_budget_in: 5000}}
workers:
  claude-code:
    env: {ANTHROPIC_API_KEY: sk-ant-api03-abcdefghijklmnop, HTTP_PROXY: "http://u:pw12@proxy"}
store: {url: "postgresql://corral:hunter22@db/corral"}
"""


def test_secret_values_are_redacted_and_numbers_kept() -> None:
    out = redacted(TEXT)
    assert "sk-ant" not in out and "hunter22" not in out and "pw12" not in out
    assert "ANTHROPIC_API_KEY: '[REDACTED]'" in out and "token_budget_in: 5000" in out
    assert redacted("") == "{}\n" and redacted(out) == out


def config(tmp_path: Path, text: str | None) -> Config:
    if text is None:
        return load(data_dir=tmp_path / "d", config_path=None)
    (tmp_path / "corral.yaml").write_text(text)
    return load(data_dir=tmp_path / "d", config_path=tmp_path / "corral.yaml")


def test_a_command_checks_against_the_engines_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_CONFIG", raising=False)
    engine = config(
        tmp_path, TEXT.replace('store: {url: "postgresql://corral:hunter22@db/corral"}\n', "")
    )
    published = record(engine, "e1", 1.0)
    assert published.hash == fingerprint(published.text) and published.source
    same, note = effective(engine, published)
    assert same is engine and note is None
    (tmp_path / "corral.yaml").unlink()
    defaults = config(tmp_path, None)
    used, note = effective(defaults, published)
    assert "notebook" in used.settings.roles and note is None  # no file of its own: silent
    mine = config(tmp_path, "roles: {default: {}}\n")
    used, note = effective(mine, published)
    assert "notebook" in used.settings.roles and used.data_dir == mine.data_dir
    assert note is not None and "is not the configuration the engine runs" in note
    broken = EngineConfig(
        engine_id="e2",
        at=2.0,
        hash="x",
        source=None,
        text="roles: {a: {mcp_config: /nonexistent.json}}\n",
    )
    used, note = effective(mine, broken)
    assert used is mine and note is not None and "cannot be used here" in note
    assert effective(mine, None) == (mine, None)


@pytest.mark.parametrize(
    ("adapter", "spec", "model", "environ", "lacks"),
    [
        ("claude-code", WorkerSpec(name="c"), None, {}, "none of ANTHROPIC_API_KEY"),
        ("claude-code", WorkerSpec(name="c"), None, {"ANTHROPIC_API_KEY": "k"}, None),
        ("claude-code", WorkerSpec(name="c", env={"ANTHROPIC_AUTH_TOKEN": "t"}), None, {}, None),
        # the engine's variable reaches the CLI only through pass_env (or the adapter's own)
        (
            "claude-code",
            WorkerSpec(name="c"),
            None,
            {"CLAUDE_CODE_OAUTH_TOKEN": "t"},
            "none of ANTHROPIC_API_KEY",
        ),
        (
            "claude-code",
            WorkerSpec(name="c", pass_env=("CLAUDE_CODE_OAUTH_TOKEN",)),
            None,
            {"CLAUDE_CODE_OAUTH_TOKEN": "t"},
            None,
        ),
        ("claude-code", WorkerSpec(name="c", config={"apiKeyHelper": "x"}), None, {}, None),
        ("codex", WorkerSpec(name="x"), None, {}, "neither OPENAI_API_KEY nor CODEX_API_KEY"),
        ("codex", WorkerSpec(name="x"), None, {"OPENAI_API_KEY": "k"}, None),
        (
            "codex",
            WorkerSpec(
                name="x",
                config={"model_provider": "m", "model_providers": {"m": {"env_key": "M_KEY"}}},
            ),
            None,
            {"OPENAI_API_KEY": "k"},
            "M_KEY (model_providers.m.env_key) is not set",
        ),
        ("opencode", WorkerSpec(name="o"), "openai/gpt-5", {}, "OPENAI_API_KEY is not set"),
        (
            "opencode",
            WorkerSpec(name="o", config={"provider": {"openai": {"options": {"apiKey": "k"}}}}),
            "openai/gpt-5",
            {},
            None,
        ),
        ("opencode", WorkerSpec(name="o"), "ollama/llama3", {}, None),  # a provider we cannot judge
    ],
)
def test_what_an_agent_cli_lacks_to_authenticate(
    adapter: str, spec: WorkerSpec, model: str | None, environ: dict[str, str], lacks: str | None
) -> None:
    from corral.workers.agents import ADAPTERS

    got = missing(adapter, spec, model, ADAPTERS[adapter].api_key_envs, environ)
    assert (got is None) if lacks is None else (got is not None and got.startswith(lacks)), got
