"""What every route shares, held on the app: the store, the configuration, the engine's wake
and the clock, and the token buckets."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request

from corral.config import Config
from corral.core.ports import Store
from corral.services import Wake

from .ratelimit import Buckets


@dataclass(frozen=True, slots=True)
class ApiState:
    store: Store
    config: Config
    wake: Wake
    buckets: Buckets
    clock: Callable[[], float] = time.time


def state_of(request: Request) -> ApiState:
    st: ApiState = request.app.state.corral
    return st
