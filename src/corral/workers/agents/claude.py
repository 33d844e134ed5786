"""Claude Code: `claude -p` with stream-json output, its hooks and MCP servers from files the
adapter writes; the hook's reply is a JSON `permissionDecision` (docs/how-to/agents.md)."""

from __future__ import annotations

import json
import uuid

from corral.domain.models import Job
from corral.workers.agents.base import (
    AgentWorker,
    Context,
    agent_prompt,
    scope_tools,
    system_prompt,
)
from corral.workers.streams import ClaudeStreamParser, StreamParser


class ClaudeCodeWorker(AgentWorker):
    """`claude -p` with stream-json output; PreToolUse/PostToolUse hooks from `--settings`."""

    adapter = "claude-code"
    default_binary = "claude"
    graceful = "INT"  # aborts the running tool; usually still prints a `result`
    api_key_envs = ("ANTHROPIC_API_KEY",)

    def prepare(self, job: Job, ctx: Context) -> dict[str, str]:
        hook = {
            "type": "command",
            "command": ctx.hook_command(),
            "timeout": max(1, round(self.spec.hook_timeout_s + 5)),
            "onFailure": "block",
        }
        settings = {
            "hooks": {
                event: [{"matcher": "*", "hooks": [hook]}]
                for event in ("PreToolUse", "PostToolUse", "PostToolUseFailure")
            }
        }
        settings.update(self.spec.config)
        (ctx.attempt_dir / "claude-settings.json").write_text(json.dumps(settings))
        # The role's MCP servers and no others (--strict-mcp-config: not a project .mcp.json),
        # in the agent's private home: their `env` may hold secrets
        (ctx.home / "mcp.json").write_text(json.dumps({"mcpServers": ctx.mcp_servers}))
        env = {
            "CLAUDE_CONFIG_DIR": str(ctx.home),
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        if ctx.gateway is not None:
            env.update(ANTHROPIC_BASE_URL=ctx.gateway.url, ANTHROPIC_API_KEY=ctx.gateway.token)
        return env

    @classmethod
    def reply(cls, verdict: str, message: str) -> tuple[int, str]:
        """Claude Code reads the verdict as JSON on stdout, with exit 0."""
        return 0, json.dumps(
            {
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": verdict,
                    "permissionDecisionReason": message,
                }
            }
        )

    def shell_env(self) -> dict[str, str]:
        env = super().shell_env()  # Claude Code takes CLAUDE_CODE_SHELL first, then SHELL
        return {**env, "CLAUDE_CODE_SHELL": env["SHELL"]}

    def argv(self, job: Job, ctx: Context) -> list[str]:
        role = ctx.role
        argv = [
            ctx.binary,
            "-p",
            agent_prompt(job),
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--settings",
            str(ctx.attempt_dir / "claude-settings.json"),
            "--setting-sources",
            "",
            # Only the scope's built-in tools exist for the model (and only the MCP servers
            # it names); the hook decides each call.
            "--tools",
            ",".join(t for t in scope_tools(role.tools) if not t.lower().startswith("mcp__")),
            "--mcp-config",
            str(ctx.home / "mcp.json"),
            "--strict-mcp-config",
        ]
        if model := ctx.model(self.spec):
            argv += ["--model", model]
        if role.max_turns:
            argv += ["--max-turns", str(role.max_turns)]
        if appended := system_prompt(job, role):
            argv += ["--append-system-prompt", appended]
        if ctx.resume:
            argv += ["--resume", ctx.resume]
        elif ctx.session_id:
            argv += ["--session-id", ctx.session_id]
        return argv + list(self.spec.args)

    @classmethod
    def parser_for(cls) -> StreamParser:
        return ClaudeStreamParser()

    def new_session_id(self) -> str | None:
        return str(uuid.uuid4())  # known before the first line, so a checkpoint always has it
