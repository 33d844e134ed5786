"""A stdio MCP server for the agent tests: newline-delimited JSON-RPC 2.0, two tools.

``python mcp_server.py LOG`` appends every message it receives to LOG, so a test can tell
which tool calls reached the server and which were refused before they left the CLI.
"""

from __future__ import annotations

import json
import sys
from typing import Any

TOOLS = [
    {
        "name": "list_runs",
        "description": "List the runs of a W&B project.",
        "inputSchema": {"type": "object", "properties": {"project": {"type": "string"}}},
    },
    {
        "name": "delete_run",
        "description": "Delete a W&B run.",
        "inputSchema": {"type": "object", "properties": {"run": {"type": "string"}}},
    },
]


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method = message.get("method")
    if method == "initialize":
        version = (message.get("params") or {}).get("protocolVersion", "2025-06-18")
        return {
            "result": {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "wandb-mock", "version": "1.0"},
            }
        }
    if method == "tools/list":
        return {"result": {"tools": TOOLS}}
    if method == "tools/call":
        name = message["params"]["name"]
        return {
            "result": {
                "content": [{"type": "text", "text": f"{name}: run-1 run-2"}],
                "isError": False,
            }
        }
    if method == "ping":
        return {"result": {}}
    return {"error": {"code": -32601, "message": f"no method {method}"}}


def main() -> None:
    with open(sys.argv[1], "a") as log:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            log.write(line if line.endswith("\n") else line + "\n")
            log.flush()
            if "id" in message:  # a request, not a notification
                reply = {"jsonrpc": "2.0", "id": message["id"], **answer(message)}
                print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
