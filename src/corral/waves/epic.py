"""The epic file: tasks with a role, a prompt, dependencies, checks and a retry bound, parsed
with errors that name the bad key's path (``tasks[1].depends_on[0]: …``).

    name: greet
    branch: epic/greet          # optional (default epic/<name>)
    max_waves: 50               # optional, at most 50
    max_attempts: 3             # optional default per task, at most 5
    on_exhausted: strike        # optional default per task: strike, decompose, human, or a list
    decomposer: planner         # optional: the role of re-decomposition jobs (default the task's)
    council: {judges: 2, roles: [judge]}   # optional; judges 0 skips the council
    tasks:
      - id: hello
        role: coder
        prompt: Write hello.txt containing "hello".
        depends_on: []
        checks: ["grep -qx hello hello.txt"]
        max_attempts: 3
        on_exhausted: [decompose, human]
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from corral.domain.errors import InvalidRequest

MAX_WAVES = 50  # at most 50 waves per epic
DEFAULT_ATTEMPTS = 3  # tries per gate, the first included
ATTEMPTS_CEILING = 5  # the seed's hard ceiling on gate tries
DEFAULT_JUDGES = 2
MAX_JUDGES = 6
MAX_TASKS = 100  # tasks of one epic, re-decomposed ones included
DECOMPOSE = "decompose"  # on_exhausted: an agent job proposes smaller tasks to replace it
HUMAN = "human"  # on_exhausted: an approval decides (approved: the last try's work is committed)
STRIKE = "strike"  # on_exhausted: the task is struck (the default; the empty list)
_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_ROLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,199}$")


class EpicFileError(InvalidRequest):
    """The epic file is malformed; the message starts with the bad key's path."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    id: str
    role: str
    prompt: str
    depends_on: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    max_attempts: int = DEFAULT_ATTEMPTS
    # What a task whose tries are spent (its bound or the strike rule) goes to, in order, before
    # it is struck: DECOMPOSE, HUMAN; () strikes it at once.
    on_exhausted: tuple[str, ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "prompt": self.prompt,
            "depends_on": list(self.depends_on),
            "checks": list(self.checks),
            "max_attempts": self.max_attempts,
            "on_exhausted": list(self.on_exhausted) or STRIKE,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Council:
    judges: int = DEFAULT_JUDGES
    roles: tuple[str, ...] = ("judge",)  # judge n gets roles[n % len(roles)]

    def role_of(self, n: int) -> str:
        return self.roles[n % len(self.roles)]


@dataclass(frozen=True, slots=True, kw_only=True)
class EpicSpec:
    name: str
    tasks: tuple[TaskSpec, ...]
    branch: str
    max_waves: int = MAX_WAVES
    council: Council = Council()
    decomposer: str | None = None  # the role of re-decomposition jobs (None: the task's role)

    def task(self, task_id: str) -> TaskSpec:
        return next(t for t in self.tasks if t.id == task_id)

    def to_data(self) -> dict[str, Any]:
        """JSON-able data that `parse` turns back into this spec (the store keeps it)."""
        data: dict[str, Any] = {
            "name": self.name,
            "branch": self.branch,
            "max_waves": self.max_waves,
            "council": {"judges": self.council.judges, "roles": list(self.council.roles)},
            "tasks": [t.to_data() for t in self.tasks],
        }
        if self.decomposer is not None:
            data["decomposer"] = self.decomposer
        return data


def load(text: str) -> EpicSpec:
    """Parse an epic file's YAML text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise EpicFileError(f"the epic file is not valid YAML{where}") from None
    return parse(data)


def parse(data: object) -> EpicSpec:
    """Validate epic data (from YAML or the API); raise EpicFileError naming the bad key."""
    top = _mapping(data, "epic")
    _known(top, "", _TOP)
    name = _text(top.get("name"), "name", pattern=_ID)
    default = _Defaults(
        attempts=_int(
            top.get("max_attempts", DEFAULT_ATTEMPTS), "max_attempts", 1, ATTEMPTS_CEILING
        ),
        on_exhausted=_on_exhausted(top.get("on_exhausted", STRIKE), "on_exhausted"),
    )
    raw_tasks = top.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise EpicFileError("tasks: a non-empty list of tasks is required")
    if len(raw_tasks) > MAX_TASKS:
        raise EpicFileError(f"tasks: {len(raw_tasks)} tasks, at most {MAX_TASKS}")
    tasks = tuple(_task(t, f"tasks[{i}]", default) for i, t in enumerate(raw_tasks))
    _check_graph(tasks)
    decomposer = top.get("decomposer")
    return EpicSpec(
        name=name,
        tasks=tasks,
        branch=_text(top.get("branch", f"epic/{name}"), "branch", pattern=_BRANCH),
        max_waves=_int(top.get("max_waves", MAX_WAVES), "max_waves", 1, MAX_WAVES),
        council=_council(top.get("council", {})),
        decomposer=None if decomposer is None else _text(decomposer, "decomposer", pattern=_ROLE),
    )


_TOP = {
    "name",
    "branch",
    "max_waves",
    "max_attempts",
    "on_exhausted",
    "decomposer",
    "council",
    "tasks",
}
_TASK = {"id", "role", "prompt", "depends_on", "checks", "max_attempts", "on_exhausted"}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Defaults:
    attempts: int
    on_exhausted: tuple[str, ...]


def _on_exhausted(raw: object, path: str) -> tuple[str, ...]:
    """`strike`, `decompose`, `human` or a list of the last two (tried in order, then struck)."""
    steps = _texts([raw] if isinstance(raw, str) else raw, path)
    if steps == (STRIKE,):
        return ()
    for i, s in enumerate(steps):
        if s not in (DECOMPOSE, HUMAN):
            where = path if isinstance(raw, str) else f"{path}[{i}]"
            raise EpicFileError(f"{where}: {s!r} is not strike, decompose or human")
    if len(set(steps)) != len(steps):
        raise EpicFileError(f"{path}: a step is named twice")
    return steps


def _task(raw: object, path: str, default: _Defaults) -> TaskSpec:
    t = _mapping(raw, path)
    _known(t, path + ".", _TASK)
    return TaskSpec(
        id=_text(t.get("id"), f"{path}.id", pattern=_ID),
        role=_text(t.get("role"), f"{path}.role", pattern=_ROLE),
        prompt=_text(t.get("prompt"), f"{path}.prompt"),
        depends_on=_texts(t.get("depends_on", []), f"{path}.depends_on", pattern=_ID),
        checks=_texts(t.get("checks", []), f"{path}.checks"),
        max_attempts=_int(
            t.get("max_attempts", default.attempts), f"{path}.max_attempts", 1, ATTEMPTS_CEILING
        ),
        on_exhausted=(
            default.on_exhausted
            if "on_exhausted" not in t
            else _on_exhausted(t["on_exhausted"], f"{path}.on_exhausted")
        ),
    )


def _council(raw: object) -> Council:
    c = _mapping(raw, "council")
    _known(c, "council.", {"judges", "roles"})
    roles = _texts(c.get("roles", ["judge"]), "council.roles", pattern=_ROLE)
    if not roles:
        raise EpicFileError("council.roles: at least one role is required")
    return Council(
        judges=_int(c.get("judges", DEFAULT_JUDGES), "council.judges", 0, MAX_JUDGES), roles=roles
    )


def _check_graph(tasks: Sequence[TaskSpec]) -> None:
    ids: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.id in ids:
            raise EpicFileError(f"tasks[{i}].id: {t.id!r} is also tasks[{ids[t.id]}]")
        ids[t.id] = i
    for i, t in enumerate(tasks):
        for j, dep in enumerate(t.depends_on):
            if dep not in ids:
                raise EpicFileError(f"tasks[{i}].depends_on[{j}]: no task {dep!r}")
            if dep == t.id:
                raise EpicFileError(f"tasks[{i}].depends_on[{j}]: a task cannot depend on itself")
    cycle = _cycle({t.id: t.depends_on for t in tasks})
    if cycle:
        raise EpicFileError(f"tasks: the dependencies form a cycle: {' -> '.join(cycle)}")


def _cycle(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """A dependency cycle as a path (first id repeated at the end), or []."""
    done: set[str] = set()
    for start in deps:
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            node, k = stack.pop()
            if k == 0:
                if node in on_path:
                    return [*path[path.index(node) :], node]
                if node in done:
                    continue
                path.append(node)
                on_path.add(node)
            if k < len(deps[node]):
                stack.append((node, k + 1))
                stack.append((deps[node][k], 0))
            else:
                done.add(node)
                on_path.discard(path.pop())
    return []


def _mapping(raw: object, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise EpicFileError(f"{path}: a mapping is required")
    return raw


def _known(m: Mapping[str, Any], prefix: str, keys: set[str]) -> None:
    for k in m:
        if k not in keys:
            raise EpicFileError(f"{prefix}{k}: unknown key (known: {', '.join(sorted(keys))})")


def _text(raw: object, path: str, *, pattern: re.Pattern[str] | None = None) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise EpicFileError(f"{path}: a non-empty string is required")
    if pattern is not None and not pattern.match(raw):
        raise EpicFileError(f"{path}: {raw!r} does not match {pattern.pattern}")
    return raw


def _texts(raw: object, path: str, *, pattern: re.Pattern[str] | None = None) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise EpicFileError(f"{path}: a list of strings is required")
    return tuple(_text(v, f"{path}[{i}]", pattern=pattern) for i, v in enumerate(raw))


def _int(raw: object, path: str, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise EpicFileError(f"{path}: an integer is required")
    if not low <= raw <= high:
        raise EpicFileError(f"{path}: {raw} is not within {low}..{high}")
    return raw
