"""The execution topology's drawing: where each job's box and each edge go in the dashboard's
inline SVG (templates/topology.html), from a world-model snapshot.

Columns are generations of the spawn tree — a job no drawn job submitted in the first, its
children in the next — and each column lists its jobs next to their parents (in their parents'
order, then by id), so a tree reads left to right. Waits (blocked_by, waits_for, waits_for_slot)
are drawn between the boxes wherever they are; the jobs of a deadlock are marked. Nothing here
is markup: the template draws these numbers and escapes every text."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from corral.world.model import Edge, World

MAX_NODES = 200  # boxes drawn at most: the deadlocked and running jobs first
COL_W, ROW_H = 230, 46  # a column's width and a row's height
BOX_W, BOX_H = 180, 34
PAD = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    job_id: str
    role: str
    state: str
    x: float
    y: float
    deadlocked: bool
    running: bool

    @property
    def mid_y(self) -> float:
        return self.y + BOX_H / 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    kind: str  # the edge's relationship: spawned_by, blocked_by, waits_for, waits_for_slot
    source: str
    target: str
    x1: float
    y1: float
    x2: float
    y2: float
    slot: str | None
    deadlocked: bool

    @property
    def d(self) -> str:
        """The SVG path: an S-curve between columns, a bulge to the right within one."""
        if self.x1 == self.x2:
            bend = self.x1 + 40
            return (
                f"M{self.x1:g},{self.y1:g} C{bend:g},{self.y1:g} {bend:g},{self.y2:g}"
                f" {self.x2:g},{self.y2:g}"
            )
        mid = (self.x1 + self.x2) / 2
        return (
            f"M{self.x1:g},{self.y1:g} C{mid:g},{self.y1:g} {mid:g},{self.y2:g}"
            f" {self.x2:g},{self.y2:g}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Drawing:
    nodes: tuple[Node, ...]
    lines: tuple[Line, ...]
    width: int
    height: int
    left_out: int  # jobs not drawn (past MAX_NODES)


def layout(world: World, *, limit: int = MAX_NODES) -> Drawing:
    labels: dict[str, tuple[str, str]] = {}
    for c in world.causal:
        labels[c.job_id] = (c.role, c.state.value)
    for a in world.agents:
        labels[a.job_id] = (a.role, a.state.value)
    stuck = {j for d in world.deadlocks for j in d.jobs}
    running = {a.job_id for a in world.agents}
    every = {a.job_id for a in world.agents}
    for e in world.edges:
        every.update((e.source, e.target))
    # which to draw when there are too many: the deadlocked, then the running, then by id
    ranked = sorted(every, key=lambda j: (j not in stuck, j not in running, j))
    shown = set(ranked[:limit])
    parent = {e.source: e.target for e in world.edges if e.kind == "spawned_by"}

    columns, row_of = _grid(shown, parent)
    col_of = {j: c for c, js in columns.items() for j in js}
    nodes = {
        j: Node(
            job_id=j,
            role=labels.get(j, ("", ""))[0],
            state=labels.get(j, ("", ""))[1],
            x=PAD + col_of[j] * COL_W,
            y=PAD + row_of[j] * ROW_H,
            deadlocked=j in stuck,
            running=j in running,
        )
        for j in shown
    }
    cycle_edges = {(e.source, e.target, e.kind) for d in world.deadlocks for e in d.edges}
    lines = [
        _line(e, s, t, (e.source, e.target, e.kind) in cycle_edges)
        for e in world.edges
        if (s := nodes.get(e.source)) is not None and (t := nodes.get(e.target)) is not None
    ]
    cols = max(columns, default=-1) + 1
    rows = max((len(js) for js in columns.values()), default=0)
    return Drawing(
        nodes=tuple(sorted(nodes.values(), key=lambda n: (n.x, n.y))),
        lines=tuple(lines),
        width=int(2 * PAD + max(cols, 1) * COL_W + BOX_W / 2),
        height=int(2 * PAD + max(rows, 1) * ROW_H),
        left_out=len(every) - len(shown),
    )


def _grid(shown: set[str], parent: dict[str, str]) -> tuple[dict[int, list[str]], dict[str, int]]:
    """Each job's column (its generation among the drawn jobs) and row (next to its parent)."""

    def generation(job: str) -> int:
        seen, n = {job}, 0
        while (up := parent.get(job)) is not None and up in shown and up not in seen:
            seen.add(up)
            job, n = up, n + 1
        return n

    columns: dict[int, list[str]] = defaultdict(list)
    for job in shown:
        columns[generation(job)].append(job)
    row_of: dict[str, int] = {}
    for col in sorted(columns):
        order = sorted(columns[col], key=lambda j: (row_of.get(parent.get(j, ""), -1), j))
        for i, job in enumerate(order):
            row_of[job] = i
    return columns, row_of


def _line(e: Edge, s: Node, t: Node, deadlocked: bool) -> Line:
    """From the waiting (or spawned) job's side facing its target to the target's near side;
    within one column, out of the right side and back in."""
    if t.x < s.x:
        x1, x2 = s.x, t.x + BOX_W
    elif t.x > s.x:
        x1, x2 = s.x + BOX_W, t.x
    else:
        x1, x2 = s.x + BOX_W, t.x + BOX_W
    return Line(
        kind=e.kind,
        source=e.source,
        target=e.target,
        x1=x1,
        y1=s.mid_y,
        x2=x2,
        y2=t.mid_y,
        slot=e.slot,
        deadlocked=deadlocked,
    )
