"""The resolved configuration kept in the data directory (config_cache.py): a command loads the
same Config from it as from the file, without pydantic, and anything that could change what
the file resolves to is a miss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral import config_cache
from corral.config import load
from corral.config_models import file_settings
from corral.domain.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "examples" / "corral.yaml"
RICH = """\
roles:
  a:
    mcp_config: mcp.json
    tools: ["Bash(git *)", Read]
    retry: {exit_codes: [3, 4], never_exit_codes: [9]}
    rate: {per_s: 2, burst: 3}
    retry_budget: {max_attempts: 5, cost_usd: 1.5}
    workspace_policy: coalesce
    knowledge: on
environments:
  ray:
    kind: ray
    address: http://127.0.0.1:8265
    num_cpus: 2
    runtime_env: {pip: [numpy], env_vars: {A: "1"}}
    throttle: {threshold: 0.8, release: 0.5}
workers:
  mine: {adapter: codex, env: {X: "1"}, config: {n: 1, deep: {list: [1, 2.5, null]}},
         gateway: {upstream: "http://127.0.0.1:9/v1", breakers: {min_calls: 2}}}
tenants:
  t1: {max_inflight: 2, period: daily}
watchdog: {stalled_attempts: {shed: 2, escalate: 5}}
events:
  sinks: [{kind: redis, url: "redis://127.0.0.1:6379"}]
retention: {keep_days: 3, roles: {a: {keep_jobs: 5}}, archive_dir: archive}
guardrails: rules.yaml
audit: {key_file: audit.key, checkpoint_every_records: 10}
engine: {socket_group: "0", heartbeat_s: 2, stale_after_s: 5}
api: {rate_limit: {per_s: 5, burst: 6}, epic_repos: [/srv/repos]}
core: {mode: inline}
store: {sqlite_synchronous: full}
"""
MCP = {"mcpServers": {"fs": {"command": "fs-server", "args": ["--root", "."]}}}


@pytest.fixture
def rich(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A configuration using every section, with the files it names, and its data directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mcp.json").write_text(json.dumps(MCP))
    (tmp_path / "rules.yaml").write_text("version: 1\n")
    path = tmp_path / "corral.yaml"
    path.write_text(RICH)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return path, data


def cached(data: Path) -> Path:
    return data / config_cache.NAME


def test_a_cached_configuration_is_the_one_the_file_resolves_to(rich: tuple[Path, Path]) -> None:
    path, data = rich
    first = load(data_dir=data, config_path=path)
    assert cached(data).stat().st_mode & 0o777 == 0o600
    again = load(data_dir=data, config_path=path)
    assert again == first
    fresh = file_settings(path.read_text(), path)
    assert again.settings == fresh.settings
    assert (again.core, again.audit, again.engine, again.api) == (
        fresh.core,
        fresh.audit,
        fresh.engine,
        fresh.api,
    )
    assert again.settings.roles["a"].mcp_servers["fs"]["args"] == ["--root", "."]
    assert again.settings.roles["a"].retry.retry_exit_codes == frozenset({3, 4})
    assert again.api.epic_repos == ("/srv/repos",) and again.core.mode == "inline"


def test_the_shipped_example_round_trips(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    first = load(data_dir=data, config_path=EXAMPLE)
    assert cached(data).exists()
    assert load(data_dir=data, config_path=EXAMPLE) == first


def test_a_hit_imports_no_pydantic(rich: tuple[Path, Path]) -> None:
    path, data = rich
    load(data_dir=data, config_path=path)
    code = (
        "import sys; from pathlib import Path; from corral.config import load; "
        f"c = load(data_dir=Path({str(data)!r}), config_path=Path({str(path)!r})); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' "
        "or m == 'corral.config_models'), c.settings.roles['a'].workspace_policy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=path.parent
    ).stdout
    assert out.split() == ["[]", "coalesce"]


@pytest.mark.parametrize("change", ["text", "mcp", "guardrails", "cwd", "home"])
def test_whatever_resolving_read_changes_is_read_anew(
    rich: tuple[Path, Path], change: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path, data = rich
    load(data_dir=data, config_path=path)
    if change == "text":
        path.write_text(RICH.replace("burst: 3", "burst: 7"))
    elif change == "mcp":
        (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    elif change == "guardrails":
        (tmp_path / "rules.yaml").write_text("rules: [\n")  # no longer loads
    elif change == "cwd":  # the same relative path, the same text, in another directory
        load(data_dir=data, config_path=Path("corral.yaml"))  # cached under that path
        other = tmp_path / "other"
        other.mkdir()
        (other / "rules.yaml").write_text("version: 1\n")
        (other / "mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
        (other / "corral.yaml").write_text(RICH)
        monkeypatch.chdir(other)
        path = Path("corral.yaml")
    else:
        monkeypatch.setenv("HOME", str(data))
    if change == "guardrails":
        with pytest.raises(ConfigError, match="guardrails"):
            load(data_dir=data, config_path=path)
        return
    got = load(data_dir=data, config_path=path)
    assert got.settings == file_settings(path.read_text(), path).settings
    if change == "text":
        assert got.settings.roles["a"].rate is not None and got.settings.roles["a"].rate.burst == 7
    if change in ("mcp", "cwd"):
        assert set(got.settings.roles["a"].mcp_servers) == {"other"}


def test_a_configuration_with_problems_is_never_cached(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    path = tmp_path / "corral.yaml"
    path.write_text("roles: {a: {concurrency: 0}}\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"roles\.a\.concurrency"):
            load(data_dir=data, config_path=path)
    assert not cached(data).exists()


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "not an object",
        "unknown class",
        "missing field",
        "too deep",
        "group-writable",
        "symlink",
    ],
)
def test_a_damaged_or_foreign_cache_is_a_miss_and_is_replaced(
    rich: tuple[Path, Path], damage: str, tmp_path: Path
) -> None:
    path, data = rich
    first = load(data_dir=data, config_path=path)
    file = cached(data)
    entry = json.loads(file.read_text())
    if damage == "garbage":
        file.write_text("{not json")
    elif damage == "not an object":
        file.write_text("[1, 2]")
    elif damage == "unknown class":  # a name outside the configuration's own classes
        entry["value"]["f"]["core"]["@"] = "Popen"
        file.write_text(json.dumps(entry))
    elif damage == "missing field":
        del entry["value"]["f"]["core"]["f"]["mode"]
        file.write_text(json.dumps(entry))
    elif damage == "too deep":
        file.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "group-writable":
        entry["value"]["f"]["core"]["f"]["mode"] = "tampered"
        file.write_text(json.dumps(entry))
        file.chmod(0o660)
    else:  # a symlink in its place is not followed
        elsewhere = tmp_path / "elsewhere.json"
        entry["value"]["f"]["core"]["f"]["mode"] = "tampered"
        elsewhere.write_text(json.dumps(entry))
        file.unlink()
        file.symlink_to(elsewhere)
    again = load(data_dir=data, config_path=path)
    assert again == first and again.core.mode == "inline"
    assert not file.is_symlink() and file.stat().st_mode & 0o777 == 0o600
    assert json.loads(file.read_text())["value"]["f"]["core"]["f"]["mode"] == "inline"


def test_the_environment_is_never_cached(
    rich: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = rich
    url = "postgresql://corral:s3cret@127.0.0.1/test"
    monkeypatch.setenv("CORRAL_STORE_URL", url)
    assert load(data_dir=data, config_path=path).store_url == url
    assert "s3cret" not in cached(data).read_text()
    monkeypatch.delenv("CORRAL_STORE_URL")
    assert load(data_dir=data, config_path=path).store_url is None


def test_no_data_directory_means_no_cache_and_no_error(tmp_path: Path) -> None:
    data = tmp_path / "not-yet"
    cfg = load(data_dir=data, config_path=EXAMPLE)
    assert cfg.data_dir == data and not data.exists()


def test_another_users_data_directory_gets_no_cache(
    rich: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, data = rich
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(data).st_uid + 1)
    load(data_dir=data, config_path=path)
    assert not cached(data).exists()


def test_a_data_directory_others_may_read_gets_no_cache_until_it_is_private(
    rich: tuple[Path, Path],
) -> None:
    path, data = rich
    data.chmod(0o755)
    load(data_dir=data, config_path=path)
    assert not cached(data).exists()
    data.chmod(0o700)
    load(data_dir=data, config_path=path)
    assert cached(data).exists()


@pytest.mark.parametrize(
    "secret",
    [
        "workers: {mine: {adapter: codex, env: {OPENAI_API_KEY: abc123}}}",
        "environments: {r: {kind: ray, address: 'http://127.0.0.1:1', "
        "runtime_env: {env_vars: {HF_TOKEN: abc}}}}",
        "roles: {a: {system_prompt: 'use ghp_" + "a" * 36 + "'}}",
        "store: {url: 'postgresql://corral:pw@127.0.0.1/test'}",
        "roles: {a: {mcp_config: mcp.json}}",  # its server has an env
    ],
    ids=["secret-name", "runtime-env", "credential-shape", "url-password", "mcp-env"],
)
def test_a_configuration_holding_a_secret_is_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.chdir(tmp_path)
    server = {"command": "srv", "env": {"PLAIN": "value"}}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"s": server}}))
    path = tmp_path / "corral.yaml"
    path.write_text(secret + "\n")
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    first = load(data_dir=data, config_path=path)
    assert not cached(data).exists()
    assert load(data_dir=data, config_path=path) == first
