"""The operator's controls over what runs: kill switches, pauses, budget ceilings and dark
launches. Each one is recorded with who set it (`by`) and when (`clock`), then wakes a running
engine (`wake`) so that it acts on the change at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from corral.core.ports import GovernanceStore, JobGovernance, JobStore
from corral.domain import bounds
from corral.domain.errors import InvalidRequest, NotFound
from corral.domain.governance import (
    BudgetCeiling,
    DarkLaunch,
    KillSwitch,
    Pause,
    Period,
    ScopeKind,
)
from corral.domain.ids import new_id, resolve
from corral.policy import prerun
from corral.services import Wake

Clock = Callable[[], float]
E = TypeVar("E", bound=StrEnum)
BUDGET_SCOPES = (ScopeKind.TENANT, ScopeKind.ROLE)  # what a budget ceiling may apply to


def choice(enum: type[E], value: str, option: str, allowed: Sequence[E] | None = None) -> E:
    """`value` as a member of `enum` (of `allowed`, if given); one line of error otherwise."""
    members = list(allowed) if allowed is not None else list(enum)
    for m in members:
        if m.value == value:
            return m
    names = [m.value for m in members]
    said = " or ".join(names) if len(names) < 3 else "one of " + ", ".join(names)
    raise InvalidRequest(f"{option} must be {said}, not {value!r}")


def scope_text(scope: ScopeKind, target: str | None) -> str:
    """`global`, `tenant acme`, `job 01J…`: a scope as the messages name it."""
    return scope.value if target is None else f"{scope.value} {target}"


def scope_of(s: KillSwitch | Pause) -> str:
    return scope_text(s.scope, s.target)


async def target_of(store: JobStore, scope: ScopeKind, target: str | None) -> str | None:
    """The target a scope names: none for global, a full job id for a job (from a unique prefix
    or suffix), else the tenant or role name as given."""
    if scope is ScopeKind.GLOBAL:
        if target:
            raise InvalidRequest("--scope global takes no --target")
        return None
    if not target:
        raise InvalidRequest(f"--scope {scope.value} needs --target")
    return (await store.get_job(target)).id if scope is ScopeKind.JOB else target


# ---- kill switches ----------------------------------------------------------------------------


def check_expiry(expires_in: float | None) -> None:
    """A kill switch's lifetime, when given, is positive seconds within bounds (domain/bounds.py;
    an edge may check it before anything else)."""
    if expires_in is not None:
        bounds.number(
            "--expires-in",
            expires_in,
            low=0,
            high=bounds.MAX_EXPIRES_S,
            low_open=True,
            unit="seconds",
        )


async def kill_switch_on(
    store: JobGovernance,
    *,
    scope: ScopeKind,
    target: str | None,
    reason: str,
    expires_in: float | None,
    by: str,
    wake: Wake,
    clock: Clock = time.time,
) -> KillSwitch:
    """Deny new runs in a scope and stop the running ones; lifts by itself after `expires_in`
    seconds when given."""
    check_expiry(expires_in)
    now = clock()
    switch = await store.activate_kill_switch(
        KillSwitch(
            id=new_id(),
            scope=scope,
            target=await target_of(store, scope, target),
            reason=reason,
            created_at=now,
            created_by=by,
            expires_at=now + expires_in if expires_in else None,
        )
    )
    wake("wake")
    return switch


async def kill_switch_off(
    store: JobGovernance,
    *,
    switch_id: str | None,
    scope: ScopeKind,
    target: str | None,
    by: str,
    wake: Wake,
    clock: Clock = time.time,
) -> list[KillSwitch]:
    """Lift one active switch (`switch_id`: its id or a unique prefix or suffix), else every
    active one in the scope; when none is in the scope but others are, say which are."""
    now = clock()
    active = await store.kill_switches(active_at=now)
    if switch_id:
        chosen_id = resolve(switch_id, [s.id for s in active], "active kill switch")
        chosen = [s for s in active if s.id == chosen_id]
    else:
        tgt = await target_of(store, scope, target)
        chosen = [s for s in active if s.scope is scope and s.target == tgt]
        if not chosen and active:  # say which exist rather than "lifted 0"
            raise InvalidRequest(
                f"no active kill switch in scope {scope_text(scope, tgt)}; active: "
                + ", ".join(f"{s.id} ({scope_of(s)})" for s in active)
                + " — lift one by id (`corral kill-switch off ID`) or give its "
                "--scope and --target"
            )
    lifted = [await store.lift_kill_switch(s.id, at=now, by=by) for s in chosen]
    wake("wake")
    return lifted


async def kill_switches(store: GovernanceStore, clock: Clock = time.time) -> list[KillSwitch]:
    """The kill switches active now."""
    return await store.kill_switches(active_at=clock())


# ---- pauses -----------------------------------------------------------------------------------


async def pause(
    store: JobGovernance,
    *,
    scope: ScopeKind,
    target: str | None,
    reason: str,
    by: str,
    wake: Wake,
    clock: Clock = time.time,
) -> Pause:
    """Stop dispatching new runs in a scope; running attempts finish."""
    p = await store.activate_pause(
        Pause(
            id=new_id(),
            scope=scope,
            target=await target_of(store, scope, target),
            reason=reason,
            created_at=clock(),
            created_by=by,
        )
    )
    wake("wake")
    return p


async def resume(
    store: JobGovernance,
    *,
    scope: ScopeKind,
    target: str | None,
    by: str,
    wake: Wake,
    clock: Clock = time.time,
) -> list[Pause]:
    """Lift every active pause of exactly this scope."""
    tgt = await target_of(store, scope, target)
    lifted = [
        await store.lift_pause(p.id, at=clock(), by=by)
        for p in await store.pauses(active_only=True)
        if p.scope is scope and p.target == tgt
    ]
    wake("wake")
    return lifted


# ---- budgets ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """A ceiling in force and where its period stands: spent, reserved, headroom."""

    ceiling: BudgetCeiling
    period_start: float
    resets_at: float | None  # None: a rolling period never resets at once
    spent_usd: float
    reserved_usd: float

    @property
    def headroom_usd(self) -> float:
        return self.ceiling.ceiling_usd - self.spent_usd - self.reserved_usd


def budget_ceiling(*, scope: str, target: str, period: str, ceiling_usd: float) -> BudgetCeiling:
    """A checked ceiling: a tenant or role scope, a target, a known period, USD within bounds."""
    return BudgetCeiling(
        scope=budget_scope(scope),
        target=_nonempty(target, "--target"),
        period=choice(Period, period, "--period"),
        ceiling_usd=bounds.usd("--ceiling-usd", ceiling_usd),
    )


def _nonempty(value: str, option: str) -> str:
    if not value.strip():
        raise InvalidRequest(f"{option} is empty")
    return value


def budget_scope(scope: str) -> ScopeKind:
    """A scope a budget ceiling may apply to (tenant or role)."""
    return choice(ScopeKind, scope, "--scope", BUDGET_SCOPES)


async def budget_lines(
    store: GovernanceStore, ceilings: Sequence[BudgetCeiling], now: float
) -> list[BudgetLine]:
    """Per ceiling: its period's start (and reset), spent and reserved now."""
    lines = []
    for c in ceilings:
        start = prerun.period_start(c.period, now)
        status = await store.budget_status(c.scope, c.target, start)
        resets = None if c.period is Period.ROLLING_30D else prerun.period_end(c.period, now)
        lines.append(BudgetLine(c, start, resets, status.spent, status.reserved))
    return lines


async def set_budget(
    store: GovernanceStore, ceiling: BudgetCeiling, *, by: str, wake: Wake, clock: Clock = time.time
) -> tuple[BudgetCeiling | None, BudgetLine]:
    """Set a ceiling (the latest per scope and target wins); the one it replaced, and the new
    one's standing."""
    before = [
        b for b in await store.budgets() if (b.scope, b.target) == (ceiling.scope, ceiling.target)
    ]
    await store.set_budget(ceiling, at=clock(), by=by)
    [line] = await budget_lines(store, [ceiling], clock())
    wake("wake")
    return (before[0] if before else None), line


async def budgets(
    store: GovernanceStore, *, scope: ScopeKind | None, target: str | None, clock: Clock = time.time
) -> list[BudgetLine]:
    """The ceilings in force (only `scope`'s and `target`'s when given) and their standing."""
    chosen = [
        c for c in await store.budgets() if scope in (None, c.scope) and target in (None, c.target)
    ]
    return await budget_lines(store, chosen, clock())


# ---- dark launches ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaunchStanding:
    """A workflow's dark launch setting (None: it has none) and its md5 position: whether the
    pre-run policy's step 5 lets its runs through (policy/prerun.py)."""

    workflow: str
    setting: DarkLaunch | None

    @property
    def position(self) -> int:
        return prerun.dark_launch_position(self.workflow)

    @property
    def in_window(self) -> bool | None:
        """Whether the position is below the percentage (None: no setting)."""
        return None if self.setting is None else self.position < self.setting.percentage

    @property
    def runs(self) -> bool:
        return self.setting is None or not self.setting.enabled or bool(self.in_window)


def check_percentage(percentage: int) -> None:
    """InvalidRequest for a dark launch percentage outside 0 … 100."""
    if not 0 <= percentage <= 100:
        raise InvalidRequest(f"--percentage must be 0 … 100, not {percentage}")


def check_workflow(workflow: str) -> None:
    """InvalidRequest for an empty workflow id (an edge may check it before anything else)."""
    if not workflow.strip():
        raise InvalidRequest("the workflow id is empty")


async def set_dark_launch(
    store: GovernanceStore,
    workflow: str,
    *,
    percentage: int | None,
    enabled: bool,
    by: str,
    wake: Wake,
    clock: Clock = time.time,
) -> LaunchStanding:
    """Enable a workflow's dark launch at `percentage`, or disable it (`percentage` None keeps
    the current one; NotFound when there is none to disable)."""
    check_workflow(workflow)
    if percentage is not None:
        check_percentage(percentage)
    current = await store.dark_launch(workflow)
    if percentage is None and current is None:
        raise NotFound(f"workflow {workflow!r} has no dark launch to disable")
    pct = percentage if percentage is not None else current.percentage if current else 0
    setting = DarkLaunch(workflow=workflow, percentage=pct, enabled=enabled)
    await store.set_dark_launch(setting, at=clock(), by=by)
    wake("wake")
    return LaunchStanding(workflow, setting)


async def dark_launch(store: GovernanceStore, workflow: str) -> LaunchStanding:
    """A workflow's standing: its latest dark launch setting, if any, and its position."""
    return LaunchStanding(workflow, await store.dark_launch(workflow))


async def dark_launches(store: GovernanceStore) -> list[LaunchStanding]:
    """The standing of every workflow that has a dark launch setting."""
    return [LaunchStanding(d.workflow, d) for d in await store.dark_launches()]
