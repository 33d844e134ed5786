"""Can an agent CLI authenticate as Corral starts it? Checked when the engine starts, so that a
missing API key is a warning in the engine's log, not a surprise at the first job.

A CLI runs with a private home (workers/agents/base.py): a login the operator made with the CLI in
their own home does not reach it. What does is the worker's `env`, and of the engine's own
environment the worker's `pass_env` and the adapter's API-key variables. Only what can be seen
from here is judged: a provider this module does not know is not warned about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.domain.settings import WorkerSpec

# The variables each CLI authenticates with (besides what its own config names).
_CLAUDE = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
)
_CODEX = ("OPENAI_API_KEY", "CODEX_API_KEY")
_OPENCODE = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def visible(spec: WorkerSpec, api_key_envs: Sequence[str], environ: Mapping[str, str]) -> set[str]:
    """The variable names the CLI will find set."""
    names = {k for k, v in spec.env.items() if v}
    return names | {n for n in (*spec.pass_env, *api_key_envs) if environ.get(n)}


def missing(
    adapter: str,
    spec: WorkerSpec,
    model: str | None,
    api_key_envs: Sequence[str],
    environ: Mapping[str, str],
) -> str | None:
    """What the CLI lacks to authenticate, in words; None when it has it (or we cannot tell)."""
    have = visible(spec, api_key_envs, environ)
    if spec.gateway is not None:  # the gateway authenticates, with its key_env
        key = spec.gateway.key_env
        if key is None or key in have or environ.get(key):
            return None
        return f"{key} (gateway.key_env) is not set"
    if adapter == "claude-code":
        if have & set(_CLAUDE) or "apiKeyHelper" in spec.config:
            return None
        return f"none of {', '.join(_CLAUDE[:3])} is set"
    if adapter == "codex":
        return _codex(spec.config, have)
    if adapter == "opencode":
        return _opencode(spec.config, model, have)
    return None


def _codex(config: Mapping[str, Any], have: set[str]) -> str | None:
    provider = config.get("model_provider")
    providers = config.get("model_providers") or {}
    custom = providers.get(provider) if isinstance(providers, Mapping) and provider else None
    if isinstance(custom, Mapping):
        key = custom.get("env_key")
        return (
            None
            if not key or key in have
            else f"{key} (model_providers.{provider}.env_key) is not set"
        )
    return None if have & set(_CODEX) else f"neither {' nor '.join(_CODEX)} is set"


def _opencode(config: Mapping[str, Any], model: str | None, have: set[str]) -> str | None:
    provider = (model or "").split("/", 1)[0]
    key = _OPENCODE.get(provider)
    options = ((config.get("provider") or {}).get(provider) or {}).get("options") or {}
    if key is None or options.get("apiKey") or key in have:
        return None
    return f"{key} is not set and provider.{provider}.options.apiKey is not configured"
