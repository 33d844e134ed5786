"""Live parsers that normalise the agent CLIs' machine-readable output.

One parser per worker process: `feed(line, now)` for each stdout line returns `StreamEvent`s
(session known, tool started/finished, running usage, results, warnings); `finish(exit_code,
now)` at process exit returns the `StreamSummary`. The recorded runs in
tests/fixtures/agent-cli/ show each format.
"""

from __future__ import annotations

from corral.workers.streams.claude import ClaudeStreamParser
from corral.workers.streams.codex import CodexStreamParser
from corral.workers.streams.model import (
    ResultEvent,
    SessionEvent,
    StreamEvent,
    StreamOptions,
    StreamParser,
    StreamSummary,
    ToolCall,
    ToolFinished,
    ToolStarted,
    UsageEvent,
    WarningEvent,
)
from corral.workers.streams.opencode import OpenCodeStreamParser
from corral.workers.streams.prices import DEFAULT_PRICES, Price, PriceTable, cost_of

__all__ = [
    "DEFAULT_PRICES",
    "ClaudeStreamParser",
    "CodexStreamParser",
    "OpenCodeStreamParser",
    "Price",
    "PriceTable",
    "ResultEvent",
    "SessionEvent",
    "StreamEvent",
    "StreamOptions",
    "StreamParser",
    "StreamSummary",
    "ToolCall",
    "ToolFinished",
    "ToolStarted",
    "UsageEvent",
    "WarningEvent",
    "cost_of",
]
