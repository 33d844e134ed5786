"""The light assembly module: what a short `corral` command imports, the adapter names it
shares with the engine, and what the engine says at start of the adapters a role uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corral.config import AGENT_ADAPTERS
from corral.workers.agents import ADAPTERS


def test_the_configuration_names_every_agent_adapter_the_engine_can_run() -> None:
    assert set(AGENT_ADAPTERS) == set(ADAPTERS)


def test_a_short_command_imports_neither_the_engine_nor_rich_nor_the_mcp_sdk() -> None:
    probe = (
        "import sys, corral.cli; "
        "print(sorted(m for m in ('corral.runtime.engine', 'corral.workers.agents', "
        "'corral.scheduler.dispatcher', 'rich', 'mcp', 'corral.mcp') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_max_turns_a_worker_cannot_honour_is_named_at_start(tmp_path: Path) -> None:
    from corral.config import Config
    from corral.config_models import parse, resolve
    from corral.runtime.engine import role_warnings

    text = """
roles:
  a: {worker: claude-code, fallback_workers: [codex], max_turns: 30}
  b: {worker: opencode, max_turns: 5, limits: {max_tool_calls: 9}}
  c: {worker: claude-code, max_turns: 30}
  d: {worker: tools, max_turns: 3}
workers:
  tools: {adapter: codex}
"""
    settings = resolve(parse(text, "c.yaml"), "c.yaml")
    config = Config(
        settings=settings,
        data_dir=tmp_path,
        store_url=None,
        sqlite_synchronous="NORMAL",
        source=None,
    )
    assert role_warnings(config) == [
        "role a: worker codex has no turn limit; max_turns 30 is not applied (max_tool_calls "
        "50 bounds it)",
        "role b: worker opencode only asks the model to stop after max_turns 5 (max_tool_calls "
        "9 bounds it)",
        "role d: worker tools has no turn limit; max_turns 3 is not applied (max_tool_calls 50 "
        "bounds it)",
    ]
