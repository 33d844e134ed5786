"""The agent CLI adapters, by the name a worker's `adapter` setting (and the hook) uses.

One module per CLI (claude.py, codex.py, opencode.py), on the shared base (base.py): how the
CLI is started under the shim, governed per tool call, and answered in its own hook language.
"""

from __future__ import annotations

from corral.workers.agents.base import AgentWorker
from corral.workers.agents.claude import ClaudeCodeWorker
from corral.workers.agents.codex import CodexWorker
from corral.workers.agents.opencode import OpenCodeWorker

ADAPTERS: dict[str, type[AgentWorker]] = {
    w.adapter: w for w in (ClaudeCodeWorker, CodexWorker, OpenCodeWorker)
}
