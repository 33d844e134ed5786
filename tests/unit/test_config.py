"""corral.yaml: defaults, the shipped example, and errors that name the key and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config import load
from corral.config_models import parse, resolve
from corral.domain.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "examples" / "corral.yaml"
SEED_ROLES = {"notebook", "cluster", "wandb", "lakehouse", "twin", "policy"}


def test_missing_config_means_sane_defaults(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_CONFIG", raising=False)
    cfg = load(data_dir=tmp_path / "d")
    assert cfg.source is None and cfg.store_url is None
    assert set(cfg.settings.roles) == {"default"} and set(cfg.settings.environments) == {"local"}
    assert cfg.settings.environments["local"].max_inflight == 4
    role = cfg.settings.roles["default"]
    assert role.limits.max_attempts == 4 and role.limits.timeout_s == 3600
    assert role.limits.grace_s == 10


def test_the_example_ships_the_seed_roles_and_environments() -> None:
    settings = resolve(parse(EXAMPLE.read_text(), str(EXAMPLE)), str(EXAMPLE))
    assert set(settings.roles) >= SEED_ROLES
    assert settings.roles["notebook"].concurrency == 2
    assert "Bash(kubectl *)" in settings.roles["notebook"].tools
    assert all(settings.roles[r].system_prompt for r in SEED_ROLES)
    assert settings.environments["torch-dev-gpu"].kind == "ray"
    assert settings.environments["local"].max_inflight == 4
    notebook = settings.roles["notebook"]
    assert (
        notebook.limits.max_tool_calls,
        notebook.limits.token_budget_in,
        notebook.limits.token_budget_out,
    ) == (50, 100_000, 10_000)
    assert {w.name: w.version for w in settings.workers.values()} == {
        "claude-code": "2.1.330",
        "codex": "0.169.0",
        "opencode": "1.18.33",
    }
    assert settings.workers["claude-code"].pass_env == ("ANTHROPIC_API_KEY",)


def test_a_tool_scope_that_does_not_parse_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"roles\.a\.tools: .*missing `\)`"):
        resolve(parse('roles: {a: {tools: ["Bash(kubectl *"]}}', "c.yaml"), "c.yaml")


def test_a_roles_mcp_config_is_read_at_load_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(
        '{"mcpServers": {"wandb": {"command": "wandb-mcp", "args": ["--ro"]},'
        ' "gh": {"type": "http", "url": "https://mcp.example/", "headers": {"X": "1"}}}}'
    )
    source = str(tmp_path / "corral.yaml")
    settings = resolve(parse("roles: {a: {mcp_config: mcp.json}}", source), source)
    assert settings.roles["a"].mcp_servers == {
        "wandb": {"type": "stdio", "command": "wandb-mcp", "args": ["--ro"]},
        "gh": {"type": "http", "url": "https://mcp.example/", "headers": {"X": "1"}},
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{", "is not JSON"),
        ('{"servers": {}}', "expected an object with `mcpServers`"),
        ('{"mcpServers": {"a b": {"command": "x"}}}', "a server name is letters"),
        ('{"mcpServers": {"w": {"args": []}}}', r"mcpServers\.w\.command: a stdio server needs"),
        ('{"mcpServers": {"w": {"type": "http"}}}', r"mcpServers\.w\.url: a http server needs"),
        ('{"mcpServers": {"w": {"type": "ws", "url": "u"}}}', r"mcpServers\.w\.type: one of"),
        ('{"mcpServers": {"w": {"command": "x", "args": "y"}}}', r"w\.args: a list of strings"),
        ('{"mcpServers": {"w": {"command": "x", "env": {"K": 1}}}}', r"w\.env: a mapping"),
    ],
)
def test_an_mcp_config_that_does_not_load_is_refused_naming_the_role(
    tmp_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "mcp.json").write_text(content)
    source = str(tmp_path / "corral.yaml")
    with pytest.raises(ConfigError, match=r"roles\.a\.mcp_config: .*" + message):
        resolve(parse("roles: {a: {mcp_config: mcp.json}}", source), source)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scheduler: {aging_s: 0}", "scheduler.aging_s: must be more than 0"),
        (
            "roles: {a: {retry: {exit_codes: nope}}}",
            "roles.a.retry.exit_codes: must be a list of whole numbers or 'nonzero'",
        ),
        (
            "store: {sqlite_synchronous: sometimes}",
            "store.sqlite_synchronous: must be one of 'OFF', 'NORMAL', 'FULL' or 'EXTRA'",
        ),
        (
            "roles: {a: {limits: {max_attempts: 0}}}",
            "roles.a.limits.max_attempts: must be at least 1",
        ),
        ("roles: {a: {limits: {timeout_s: soon}}}", "roles.a.limits.timeout_s: must be a number"),
        (
            "roles: {a: {concurency: 2}}",
            "roles.a.concurency: unknown key (did you mean "
            "'concurrency'? known: anomaly, concurrency, cost_estimate_usd,",
        ),
        (
            "workers: {w: {adapter: cmd}}",
            "workers.w.adapter: must be one of 'command', 'claude-code', 'codex' or 'opencode'",
        ),
        ("scheduler: {colour: 1}", "scheduler.colour: unknown key (known: aging_s,"),
        (
            "roles: {a: {worker: claude-cde}}",
            "roles.a.worker: unknown worker kind 'claude-cde' "
            "(did you mean 'claude-code'? known: claude-code,",
        ),
        ("roles: {a: {fallback_workers: [codx]}}", "roles.a.fallback_workers: unknown worker kind"),
        ("workers: {mine: {binary: x}}", "workers.mine.adapter: is required for a worker kind"),
        ("engine: {heartbeat_s: 0}", "engine.heartbeat_s: must be more than 0"),
        (
            "engine: {heartbeat_s: 5, stale_after_s: 6}",
            "engine: stale_after_s (6) must be at least twice heartbeat_s (5)",
        ),
    ],
)
def test_errors_name_the_key_in_plain_words(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text, "c.yaml")
    assert str(err.value).startswith(f"c.yaml: {message}"), str(err.value)
    assert "Input should" not in str(err.value) and "Value error" not in str(err.value)


def test_every_problem_is_listed_on_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse("scheduler: {aging_s: 0}\nroles: {a: {worker: codx, concurrency: 0}}", "c.yaml")
    assert str(err.value) == (
        "c.yaml: 3 problems: scheduler.aging_s: must be more than 0; roles.a.concurrency: must "
        "be at least 1; roles.a.worker: unknown worker kind 'codx' (did you mean 'codex'? known:"
        " claude-code, codex, command, opencode)"
    )


def test_env_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_DATA_DIR", str(tmp_path / "dd"))
    monkeypatch.setenv("CORRAL_STORE_URL", "postgresql://x@127.0.0.1/db")
    monkeypatch.setenv("CORRAL_CONFIG", str(EXAMPLE))
    cfg = load()
    assert cfg.data_dir == (tmp_path / "dd").resolve()
    assert cfg.store_url == "postgresql://x@127.0.0.1/db" and cfg.source == EXAMPLE


def test_a_roles_retry_budget_and_detached_are_read_and_checked_against_its_limits() -> None:
    roles = resolve(
        parse(
            "roles: {r: {detached: true, retry_budget: {max_attempts: 5, "
            "max_timeout_s: 600, window_s: 3600, cost_usd: 2.5}, "
            "limits: {timeout_s: 600}}}",
            "c.yaml",
        ),
        "c.yaml",
    ).roles
    budget = roles["r"].retry_budget
    assert (budget.max_attempts, budget.max_timeout_s, budget.window_s, budget.cost_usd) == (
        5,
        600.0,
        3600.0,
        2.5,
    )
    assert roles["r"].detached and not roles["default"].detached
    for text, key in (
        (
            "roles: {r: {retry_budget: {max_attempts: 2}}}",
            r"roles\.r\.limits\.max_attempts: 4 is more than retry_budget",
        ),
        (
            "roles: {r: {retry_budget: {max_timeout_s: 60}}}",
            r"roles\.r\.limits\.timeout_s: 3600 is more than retry_budget",
        ),
    ):
        with pytest.raises(ConfigError, match=key):
            resolve(parse(text, "c.yaml"), "c.yaml")
    with pytest.raises(ConfigError, match=r"roles\.r\.retry_budget\.cost_usd"):
        parse("roles: {r: {retry_budget: {cost_usd: -1}}}", "c.yaml")


def test_the_engine_heart_beat_and_when_a_peer_is_declared_dead_are_read() -> None:
    defaults = parse("", "c.yaml").engine
    assert (defaults.heartbeat_s, defaults.stale_after_s) == (5.0, 15.0)
    engine = parse("engine: {heartbeat_s: 0.5, stale_after_s: 2}", "c.yaml").engine
    assert (engine.heartbeat_s, engine.stale_after_s) == (0.5, 2.0)


def test_event_sinks_are_read_with_their_defaults() -> None:
    events = resolve(
        parse(
            "events:\n  max_backlog: 10\n  sinks:\n"
            "    - {kind: nats, url: 'nats://127.0.0.1:4222'}\n"
            "    - {kind: redis, url: 'redis://127.0.0.1:6379/0', maxlen: 5,"
            " name: r2}\n",
            "c.yaml",
        ),
        "c.yaml",
    ).events
    assert events.max_backlog == 10
    nats, redis = events.sinks
    assert (nats.name, nats.kind, nats.stream, nats.maxlen) == ("nats", "nats", "CORRAL", None)
    assert (redis.name, redis.maxlen) == ("r2", 5)
    assert resolve(parse("", "c.yaml"), "c.yaml").events.sinks == ()


@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        ("[{kind: nats, url: 'redis://h'}]", "a nats sink's url must start with nats:// or tls://"),
        ("[{kind: redis, url: 'http://h'}]", "a redis sink's url must start with redis://"),
        ("[{kind: kafka, url: 'nats://h'}]", "events.sinks.0.kind"),
        ("[{kind: redis, url: 'redis://h', stream: S}]", "stream is for a nats sink"),
        ("[{kind: nats, url: 'nats://h', maxlen: 5}]", "maxlen is for a redis sink"),
        (
            "[{kind: redis, url: 'redis://a'}, {kind: redis, url: 'redis://b'}]",
            "two sinks are named 'redis'",
        ),
        ("[{kind: nats, url: 'nats://h', timeout_s: 0}]", "events.sinks.0.timeout_s"),
    ],
)
def test_a_bad_event_sink_is_refused_at_load_naming_it(sinks: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^c\.yaml: ") as err:
        parse(f"events:\n  sinks: {sinks}\n", "c.yaml")
    assert message in str(err.value)
