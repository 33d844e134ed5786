"""The dashboard: server-rendered pages at `/ui` beside the HTTP API, on the same port, over
the same services and tokens (docs/how-to/dashboard.md). Jinja2 templates with autoescaping,
htmx served from this package for the live parts, no script of our own inline or from outside.

`mount` is what `corral serve` hands the API's `create_app` (wired in corral/main.py: the API
and the dashboard are independent edges)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from corral.config import Config
from corral.core.ports import Store
from corral.services import Wake


def mount(
    config: Config,
    store: Store,
    wake: Wake,
    clock: Callable[[], float] = time.time,
    *,
    secure: bool = False,
) -> Any:
    """The dashboard's ASGI app over `store`; `secure`: served over TLS (Secure cookies). Its
    sessions are signed with a key derived from the secrets key, which every engine of one
    store shares: a session begun on one engine is good on all of them (session.py)."""
    from corral.workers.sealing import KeyFile

    from .app import create_ui
    from .session import shared_key

    key = shared_key(KeyFile(config.secrets_key).load(create=True))
    return create_ui(config, store, wake=wake, clock=clock, secure=secure, key=key)
