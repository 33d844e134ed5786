"""What every route shares, held on the app: the store, the configuration, the engine's wake
and the clock, the token buckets and the submission service it keeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request

from corral.config import Config
from corral.core.ports import Store
from corral.services import Wake
from corral.services.submissions import KeptSubmissions

from .ratelimit import Buckets


@dataclass(frozen=True, slots=True)
class ApiState:
    store: Store
    config: Config
    wake: Wake
    buckets: Buckets
    clock: Callable[[], float] = time.time
    submissions: KeptSubmissions = field(default_factory=KeptSubmissions)


def state_of(request: Request) -> ApiState:
    st: ApiState = request.app.state.corral
    return st
