"""Questions to the engine serving a data directory, through its control socket
(runtime/control.py): the core's live mechanism — breakers, escalations, permits, the
watchdog — which lives in the running engine, not in the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.domain.errors import CorralError, EngineNotRunning, NotPermitted
from corral.runtime.control import poke


def ask_engine(data_dir: Path, core_op: str, **fields: Any) -> dict[str, Any]:
    """One request to the core of the engine serving `data_dir`: the engine's whole answer."""
    answer = poke(data_dir, "core", timeout=10, core_op=core_op, **fields)
    if answer is None:
        raise EngineNotRunning(f"no engine is serving {data_dir}: start `corral serve` first")
    if not answer.get("ok"):
        if answer.get("refused"):  # an operator command from one of the engine's jobs
            raise NotPermitted(str(answer.get("error")))
        raise CorralError(str(answer.get("error")))
    return answer


def ask_core(data_dir: Path, core_op: str, **fields: Any) -> Any:
    """One request to the core of the engine serving `data_dir`: its result."""
    return ask_engine(data_dir, core_op, **fields).get("result")


def snapshot(data_dir: Path) -> dict[str, Any]:
    """The core's live state: breakers, escalations, permits, watchdog, store health."""
    result: dict[str, Any] = ask_core(data_dir, "snapshot")
    return result


def reset_breaker(data_dir: Path, name: str) -> None:
    """Close a breaker by hand (recorded as an operator reset)."""
    ask_core(data_dir, "reset_breaker", name=name)


def clear_escalation(data_dir: Path, escalation: str) -> tuple[Any, dict[str, Any] | None]:
    """End an escalation: the engine's answer (the escalation cleared) and, for a core crash
    loop, the core's state after."""
    answer = ask_engine(data_dir, "clear_escalation", escalation=escalation)
    return answer.get("result"), answer.get("core")
