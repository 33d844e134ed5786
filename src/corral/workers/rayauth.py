"""The token a Ray environment's job server asks for (`environments.E.auth`): Ray's own token
auth (`RAY_AUTH_MODE=token`) or a proxy in front of the head. It is read from its file or the
engine's environment each time it is needed, sent as `Authorization: Bearer …` on every call
(the header Ray's `JobSubmissionClient` sends) and kept out of everything Corral writes: the
environment's watcher (workers/raywatch.py) holds it in memory only, never on a command line,
and redacts it from the job's log like a job's secret."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from corral.domain.errors import WorkerMisconfigured

if TYPE_CHECKING:
    from corral.domain.settings import EnvSpec


def token(env: EnvSpec, environ: Mapping[str, str] = os.environ) -> str | None:
    """The environment's token now (None: it has no `auth`). A token that cannot be read is
    the configuration's fault, said without the token."""
    if env.auth_token_file is not None:
        try:
            value = Path(env.auth_token_file).read_text().strip()
        except OSError as err:
            raise WorkerMisconfigured(
                f"environment {env.name}: cannot read its Ray token file "
                f"{env.auth_token_file}: {err.strerror}"
            ) from None
        if not value:
            raise WorkerMisconfigured(
                f"environment {env.name}: its Ray token file {env.auth_token_file} is empty"
            )
        return value
    if env.auth_token_env is not None:
        value = environ.get(env.auth_token_env, "").strip()
        if not value:
            raise WorkerMisconfigured(
                f"environment {env.name}: its Ray token variable {env.auth_token_env} is not "
                "set in the engine's environment"
            )
        return value
    return None


def headers(value: str | None) -> dict[str, str]:
    """The HTTP headers that carry the token (none without one)."""
    return {"Authorization": f"Bearer {value}"} if value else {}


def scrub(text: str, value: str | None) -> str:
    """`text` without the token in it (an error that quoted a request, say)."""
    return text.replace(value, "[redacted]") if value else text
