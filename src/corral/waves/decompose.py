"""Re-decomposition's pure rule (docs/how-to/epics.md): a task whose tries are spent is
replaced by the smaller tasks an agent proposed in a machine-readable file, validated like an
epic file. No I/O: services/escalate.py reads the file and persists the new plan.

    {"tasks": [{"id": "parse", "prompt": "Write the parser."},
               {"id": "wire", "prompt": "Call it from main.", "depends_on": ["parse"]}]}

A proposal names only ids, prompts and dependencies among its own tasks. Corral decides the
rest, so an agent never widens what it may run: every new task has the replaced task's role
and retry bound; the ones no other new task depends on carry its checks (the operator's
commands: an agent never proposes a command the engine runs); none is re-decomposed again.
Each new id is the replaced task's id, a dash and the proposed id. Every new task also depends
on what the replaced task depended on; the replaced task's dependents depend on the last new
ones instead of it. The new plan must hold within the epic's task limit and its waves left.
"""

from __future__ import annotations

import re
from dataclasses import replace

from corral.waves.epic import (
    DECOMPOSE,
    MAX_TASKS,
    EpicFileError,
    EpicSpec,
    TaskSpec,
    parse,
)

PROPOSAL_FILE = "proposal.json"
MAX_PROPOSED = 10  # tasks one re-decomposition may propose
_LOCAL_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}$")


class ProposalError(EpicFileError):
    """The proposal is not a valid set of smaller tasks; the message names the bad key."""


def replan(spec: EpicSpec, task_id: str, data: object, *, waves_left: int) -> EpicSpec:
    """The epic's spec with `task_id` replaced by the proposed tasks (ProposalError when the
    proposal is not valid)."""
    old = spec.task(task_id)
    proposed = _proposed(data, old)
    known = {t.id for t in spec.tasks}
    for i, t in enumerate(proposed):
        if t.id in known:
            raise ProposalError(f"tasks[{i}].id: the epic has a task {t.id!r} already")
    if len(spec.tasks) + len(proposed) > MAX_TASKS:
        raise ProposalError(
            f"tasks: {len(proposed)} more tasks exceed the epic's limit of {MAX_TASKS}"
        )
    sinks = [t.id for t in proposed if not any(t.id in o.depends_on for o in proposed)]
    tasks: list[TaskSpec] = []
    for t in spec.tasks:
        if t.id == task_id:
            tasks += [t, *proposed]
        elif task_id in t.depends_on:
            deps = [d for d in t.depends_on if d != task_id] + sinks
            tasks.append(replace(t, depends_on=tuple(deps)))
        else:
            tasks.append(t)
    try:  # the whole plan again, as any epic file (ids, dependencies, cycles)
        plan = parse({**spec.to_data(), "tasks": [t.to_data() for t in tasks]})
    except EpicFileError as err:
        raise ProposalError(f"the new plan is not valid: {err}") from None
    needed = _depth(proposed)
    if needed > waves_left:
        raise ProposalError(
            f"tasks: the proposed tasks need {needed} waves in a row; "
            f"the epic has {waves_left} left"
        )
    return plan


def _proposed(data: object, old: TaskSpec) -> list[TaskSpec]:
    if not isinstance(data, dict) or set(data) != {"tasks"}:
        raise ProposalError('a proposal is a JSON object {"tasks": [...]} and nothing else')
    raw = data["tasks"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_PROPOSED:
        raise ProposalError(f"tasks: a list of 1 to {MAX_PROPOSED} tasks is required")
    local: list[tuple[str, str, list[str]]] = []
    for i, item in enumerate(raw):
        local.append(_item(item, f"tasks[{i}]"))
    ids = [lid for lid, _, _ in local]
    for i, (lid, _, deps) in enumerate(local):
        if lid in ids[:i]:
            raise ProposalError(f"tasks[{i}].id: {lid!r} is named twice")
        for j, d in enumerate(deps):
            if d not in ids:
                raise ProposalError(f"tasks[{i}].depends_on[{j}]: no proposed task {d!r}")
    gates = {d for _, _, deps in local for d in deps}
    steps = tuple(s for s in old.on_exhausted if s != DECOMPOSE)
    return [
        TaskSpec(
            id=f"{old.id}-{lid}",
            role=old.role,
            prompt=prompt,
            depends_on=(*old.depends_on, *(f"{old.id}-{d}" for d in deps)),
            checks=() if lid in gates else old.checks,
            max_attempts=old.max_attempts,
            on_exhausted=steps,
        )
        for lid, prompt, deps in local
    ]


def _item(item: object, path: str) -> tuple[str, str, list[str]]:
    if not isinstance(item, dict):
        raise ProposalError(f"{path}: a mapping is required")
    extra = sorted(set(item) - {"id", "prompt", "depends_on"})
    if extra:
        raise ProposalError(
            f"{path}.{extra[0]}: unknown key (a proposal names id, prompt and depends_on only)"
        )
    lid, prompt, deps = item.get("id"), item.get("prompt"), item.get("depends_on", [])
    if not isinstance(lid, str) or not _LOCAL_ID.match(lid):
        raise ProposalError(f"{path}.id: a string matching {_LOCAL_ID.pattern} is required")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ProposalError(f"{path}.prompt: a non-empty string is required")
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ProposalError(f"{path}.depends_on: a list of proposed ids is required")
    return lid, prompt, deps


def _depth(tasks: list[TaskSpec]) -> int:
    """The longest chain of the proposed tasks (the waves they need one after another); called
    once the plan is known to have no cycle."""
    ids = {t.id: t for t in tasks}
    memo: dict[str, int] = {}

    def depth(tid: str) -> int:
        if tid not in memo:
            memo[tid] = 1 + max((depth(d) for d in ids[tid].depends_on if d in ids), default=0)
        return memo[tid]

    return max(depth(t.id) for t in tasks)
