"""The light assembly module: what a short `corral` command imports, and the adapter names it
shares with the engine."""

from __future__ import annotations

import subprocess
import sys

from corral.config import AGENT_ADAPTERS
from corral.workers.agents import ADAPTERS


def test_the_configuration_names_every_agent_adapter_the_engine_can_run() -> None:
    assert set(AGENT_ADAPTERS) == set(ADAPTERS)


def test_a_short_command_imports_neither_the_engine_nor_rich() -> None:
    probe = ("import sys, corral.cli; "
             "print(sorted(m for m in ('corral.runtime.engine', 'corral.workers.agents', "
             "'corral.scheduler.dispatcher', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
