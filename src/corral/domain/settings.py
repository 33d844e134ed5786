"""Resolved configuration as frozen values: what the inner rooms may know of corral.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.domain.models import Limits


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Which failures are retried and how long to wait (exponential backoff, full jitter)."""

    base_s: float = 5.0
    cap_s: float = 300.0
    # None: every non-zero exit code is retryable; otherwise only these.
    retry_exit_codes: frozenset[int] | None = None
    never_exit_codes: frozenset[int] = frozenset({126, 127})  # cannot execute / not found
    retry_signals: bool = True  # a process killed by a signal it did not get from us
    retry_timeouts: bool = False
    retry_lost: bool = True  # the process vanished while the control plane was down


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleSpec:
    name: str
    worker: str = "command"
    concurrency: int = 4
    limits: Limits = field(default_factory=Limits)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tools: tuple[str, ...] = ()
    system_prompt: str = ""
    description: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvSpec:
    name: str
    kind: str = "local"  # "local" | "ray"
    address: str | None = None
    max_inflight: int = 4  # seed 000: 4 concurrent attempts per environment


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSpec:
    # Aging window: a job of priority p is queued as if it arrived p × aging_s later than it did,
    # so priority orders the queue yet no job waits behind newer work for more than 4 × aging_s.
    aging_s: float = 60.0
    poll_interval_s: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    roles: Mapping[str, RoleSpec]
    environments: Mapping[str, EnvSpec]
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    default_role: str = "default"
    default_env: str = "local"
