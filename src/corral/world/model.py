"""A snapshot of the fleet built from records: agents, environments, topology, causal graph.

`build` takes what the store holds (jobs, the attempts in flight with their latest checkpoint,
the waits jobs recorded) and the configured caps, and returns a `World`. Nothing here reads the
store or the clock: the caller passes both in, so the same inputs give the same snapshot.

Edges point from the job that waits (or was spawned) to the job it depends on:

- `spawned_by`: a job submitted from inside another (its parent);
- `blocked_by`: a job whose `after` dependency has not ended;
- `waits_for`: a running job that follows another to its end (`corral wait` or
  `corral submit --wait` from inside a job records it);
- `waits_for_slot`: a queued job submitted from inside another whose role or environment has
  every slot taken, one of them by its own ancestor: to each job holding one (`slot` names
  which: `role:NAME` or `env:NAME`). A queued job no ancestor of which holds the slot simply
  waits its turn (the environment's queue depth counts it), so it gets no edge: thousands of
  queued jobs behind a full role would otherwise make the topology quadratic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from corral.domain.agents import Checkpoint
from corral.domain.states import JobState


class JobLike(Protocol):
    """What the snapshot reads of a job: a whole Job, or the store's narrow JobSketch."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> JobState: ...
    @property
    def role(self) -> str: ...
    @property
    def env_name(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def parent_id(self) -> str | None: ...
    @property
    def after(self) -> tuple[str, ...]: ...
    @property
    def deps_pending(self) -> int: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def worker(self) -> str: ...
    @property
    def workflow(self) -> str | None: ...


class AttemptLike(Protocol):
    """What the snapshot reads of an attempt in flight: an Attempt, or an AttemptSketch."""

    @property
    def index(self) -> int: ...
    @property
    def started_at(self) -> float | None: ...


EdgeKind = Literal["spawned_by", "blocked_by", "waits_for", "waits_for_slot"]
# Edges a job cannot make progress past until their target moves: the waits-for graph.
WAIT_KINDS: frozenset[str] = frozenset({"blocked_by", "waits_for", "waits_for_slot"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentView:
    """A running attempt: whose, how far it got (from its latest checkpoint)."""

    job_id: str
    attempt: int
    role: str
    kind: str  # the job's kind its baselines are kept for: its workflow, else its worker kind
    state: JobState
    worker: str
    env: str
    tenant: str
    started_at: float | None
    tool_calls: int
    current_tool: str | None
    session_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvView:
    """One environment's user plane: attempts in flight against its cap, jobs waiting for it.

    `cluster_status` and `gpu_utilisation` come from an environment that reports them (a
    cluster); a local environment reports neither (None)."""

    name: str
    kind: str
    inflight: int
    cap: int
    queued: int
    cluster_status: str | None = None
    gpu_utilisation: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    kind: EdgeKind
    source: str  # the job that waits, or was spawned
    target: str  # the job it waits for, or its parent
    slot: str | None = None  # waits_for_slot: `role:NAME` or `env:NAME`


@dataclass(frozen=True, slots=True, kw_only=True)
class UserPlaneRef:
    """What a job started outside Corral's own processes. Nothing records these yet: every
    field is None until the environments that start them record their ids."""

    ray_submission_id: str | None = None
    notebook: str | None = None
    wandb_run: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CausalLink:
    """Intent → job → user-plane job → outcome: the root intent is the first job of the chain
    of parents the snapshot knows. A job waiting in the queue that no other job submitted has
    caused nothing yet: it has no link (its environment's queue depth counts it)."""

    job_id: str
    root_id: str
    parent_id: str | None
    role: str
    state: JobState
    user_plane: UserPlaneRef = field(default_factory=UserPlaneRef)
    outcome: str | None = None  # the final state once the job ended
    exit_code: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadlock:
    """A cycle in the waits-for graph: `jobs` in order, `edges[i]` from `jobs[i]` to the next
    (the last one back to the first)."""

    jobs: tuple[str, ...]
    edges: tuple[Edge, ...]

    @property
    def key(self) -> str:
        """The same cycle, whichever job it is read from: its jobs, sorted."""
        return ",".join(sorted(self.jobs))

    def describe(self) -> str:
        parts = [f"{e.source} {e.kind.replace('_', ' ')} {e.target}" for e in self.edges]
        return "; ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    at: float
    agents: tuple[AgentView, ...]
    environments: tuple[EnvView, ...]
    edges: tuple[Edge, ...]
    causal: tuple[CausalLink, ...]
    deadlocks: tuple[Deadlock, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Caps:
    """The configured caps the snapshot measures against."""

    roles: Mapping[str, int]  # role → concurrency
    envs: Mapping[str, tuple[str, int]]  # environment → (kind, max in flight)


WAITING = frozenset({JobState.QUEUED, JobState.RETRY_WAIT})


def build(
    jobs: Iterable[JobLike],
    inflight: Sequence[tuple[JobLike, AttemptLike]],
    checkpoints: Mapping[str, Checkpoint],
    waits: Mapping[str, Iterable[str]],
    caps: Caps,
    *,
    now: float,
    queued: Mapping[str, int] | None = None,
) -> World:
    """The world as these records show it. `jobs` are the jobs to show (the active ones and
    any finished ones worth a causal link); `checkpoints` the latest of each running job;
    `waits` the jobs each running job is following to their end; `queued` the jobs waiting in
    each environment's queue, when counted apart (then `jobs` need not hold the waiting jobs
    that no other job submitted and no dependency holds back: they add no edge and no link)."""
    by_id: dict[str, JobLike] = {j.id: j for j in jobs}
    for j, _ in inflight:
        by_id.setdefault(j.id, j)
    agents = tuple(_agent(j, a, checkpoints.get(j.id)) for j, a in inflight)
    holders = _holders(inflight)
    edges = _edges(by_id, waits, holders, caps)
    return World(
        at=now,
        agents=agents,
        environments=_environments(by_id, holders, caps, queued),
        edges=edges,
        causal=tuple(
            _causal(j, by_id)
            for j in sorted(by_id.values(), key=lambda j: j.id)
            if j.parent_id is not None or j.state not in WAITING
        ),
        deadlocks=find_deadlocks(edges),
    )


def _agent(j: JobLike, a: AttemptLike, cp: Checkpoint | None) -> AgentView:
    current = cp is not None and cp.attempt == a.index
    return AgentView(
        job_id=j.id,
        attempt=a.index,
        role=j.role,
        kind=j.workflow or j.worker,
        state=j.state,
        worker=j.worker,
        env=j.env_name,
        tenant=j.tenant,
        started_at=a.started_at,
        tool_calls=cp.tool_call_count if cp is not None and current else 0,
        current_tool=cp.last_tool if cp is not None and current else None,
        session_id=cp.session_id if cp is not None and current else None,
    )


def _holders(inflight: Sequence[tuple[JobLike, AttemptLike]]) -> dict[str, list[str]]:
    """Slot → the jobs holding one: `role:NAME` and `env:NAME`."""
    held: dict[str, list[str]] = defaultdict(list)
    for j, _ in inflight:
        held[f"role:{j.role}"].append(j.id)
        held[f"env:{j.env_name}"].append(j.id)
    return held


def _full(slot: str, holders: Mapping[str, list[str]], caps: Caps) -> bool:
    kind, _, name = slot.partition(":")
    if kind == "role":
        cap = caps.roles.get(name)
    else:
        env = caps.envs.get(name)
        cap = env[1] if env is not None else None
    return cap is not None and len(holders.get(slot, ())) >= cap


def _edges(
    by_id: Mapping[str, JobLike],
    waits: Mapping[str, Iterable[str]],
    holders: Mapping[str, list[str]],
    caps: Caps,
) -> tuple[Edge, ...]:
    out: list[Edge] = []
    for j in sorted(by_id.values(), key=lambda j: j.id):
        if j.parent_id is not None:
            out.append(Edge(kind="spawned_by", source=j.id, target=j.parent_id))
        if j.state.terminal:
            continue
        for dep in j.after:
            d = by_id.get(dep)
            if j.deps_pending and d is not None and not d.state.terminal:
                out.append(Edge(kind="blocked_by", source=j.id, target=dep))
        if j.state.in_flight:
            for target in sorted(set(waits.get(j.id, ()))):
                t = by_id.get(target)
                if t is not None and not t.state.terminal and target != j.id:
                    out.append(Edge(kind="waits_for", source=j.id, target=target))
        if j.state is JobState.QUEUED and not j.deps_pending and j.parent_id is not None:
            up = _ancestors(j, by_id)
            for slot in (f"role:{j.role}", f"env:{j.env_name}"):
                if _full(slot, holders, caps) and up.intersection(holders[slot]):
                    out.extend(
                        Edge(kind="waits_for_slot", source=j.id, target=h, slot=slot)
                        for h in holders[slot]
                        if h != j.id
                    )
    return tuple(out)


def _ancestors(j: JobLike, by_id: Mapping[str, JobLike]) -> set[str]:
    """The job's parent, its parent's parent … as far as the snapshot knows them."""
    up: set[str] = set()
    parent = j.parent_id
    while parent is not None and parent not in up:
        up.add(parent)
        p = by_id.get(parent)
        parent = p.parent_id if p is not None else None
    return up


def _environments(
    by_id: Mapping[str, JobLike],
    holders: Mapping[str, list[str]],
    caps: Caps,
    counted: Mapping[str, int] | None,
) -> tuple[EnvView, ...]:
    queued: dict[str, int] = defaultdict(int)
    if counted is not None:
        queued.update({n: c for n, c in counted.items() if c > 0})
    else:
        for j in by_id.values():
            if j.state in WAITING:
                queued[j.env_name] += 1
    names = sorted(set(caps.envs) | set(queued) | {s[4:] for s in holders if s.startswith("env:")})
    return tuple(
        EnvView(
            name=n,
            kind=caps.envs.get(n, ("local", 0))[0],
            inflight=len(holders.get(f"env:{n}", ())),
            cap=caps.envs.get(n, ("local", 0))[1],
            queued=queued.get(n, 0),
        )
        for n in names
    )


def _causal(j: JobLike, by_id: Mapping[str, JobLike]) -> CausalLink:
    root, seen = j, {j.id}
    while root.parent_id is not None and root.parent_id in by_id and root.parent_id not in seen:
        root = by_id[root.parent_id]
        seen.add(root.id)
    if root.parent_id is not None and root.parent_id not in by_id:
        root_id = root.parent_id  # the chain goes on past what the snapshot holds
    else:
        root_id = root.id
    return CausalLink(
        job_id=j.id,
        root_id=root_id,
        parent_id=j.parent_id,
        role=j.role,
        state=j.state,
        outcome=j.state.value if j.state.terminal else None,
        exit_code=j.exit_code,
    )


# ---- deadlocks ------------------------------------------------------------------------------


def find_deadlocks(edges: Iterable[Edge]) -> tuple[Deadlock, ...]:
    """The cycles of the waits-for graph, one per strongly connected group of jobs.

    Dependencies and `waits_for` are waits on one job: any cycle through them is a deadlock.
    A slot wait is a wait on *any* holder of the slot: the queued job is stuck only when every
    holder waits (directly or not) on it, so its slot edges count only then (the holders of
    a full slot are its slot edges' targets)."""
    hard: dict[str, list[Edge]] = defaultdict(list)
    slot_waits: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for e in edges:
        if e.kind == "waits_for_slot" and e.slot is not None:
            slot_waits[(e.source, e.slot)].append(e)
        elif e.kind in WAIT_KINDS:
            hard[e.source].append(e)
    # A slot wait joins the graph once every holder reaches the waiting job; adding one may let
    # another qualify, so repeat until nothing changes (each joins at most once).
    pending = dict(slot_waits)
    changed = True
    while changed and pending:
        changed = False
        for (source, slot), group in list(pending.items()):
            if all(_reaches(hard, e.target, source) for e in group):
                hard[source].extend(group)
                del pending[(source, slot)]
                changed = True
    core = _trim(hard)
    return tuple(_cycle(core, comp) for comp in _components(core))


def _trim(graph: Mapping[str, list[Edge]]) -> dict[str, list[Edge]]:
    """The graph without the jobs no cycle can pass through: one nothing waits on, or one
    that waits on nothing (left), repeatedly. Thousands of queued jobs behind running ones
    wait on jobs that wait on nothing: the search for cycles then looks at the few left."""
    outs: dict[str, int] = defaultdict(int)
    ins: dict[str, list[Edge]] = defaultdict(list)
    for source, es in graph.items():
        for e in es:
            outs[source] += 1
            ins[e.target].append(e)
    incoming = {node: len(es) for node, es in ins.items()}
    nodes = set(outs) | set(ins)
    gone = [n for n in nodes if not outs.get(n) or not incoming.get(n)]
    removed: set[str] = set()
    while gone:
        node = gone.pop()
        if node in removed:
            continue
        removed.add(node)
        for e in graph.get(node, ()):  # what it waits on loses a waiter
            incoming[e.target] -= 1
            if incoming[e.target] == 0:
                gone.append(e.target)
        for e in ins.get(node, ()):  # what waits on it loses a way on
            outs[e.source] -= 1
            if outs[e.source] == 0:
                gone.append(e.source)
    return {
        n: [e for e in es if e.target not in removed] for n, es in graph.items() if n not in removed
    }


def _reaches(graph: Mapping[str, list[Edge]], start: str, goal: str) -> bool:
    seen, stack = {start}, [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        for e in graph.get(node, ()):
            if e.target not in seen:
                seen.add(e.target)
                stack.append(e.target)
    return False


def _components(graph: Mapping[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected groups with a cycle (more than one job, or a job waiting on
    itself), each sorted, in order of their first job (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {e.target for es in graph.values() for e in es})
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            out = graph.get(node, [])
            if i < len(out):
                work.append((node, i + 1))
                nxt = out[i].target
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = _pop_component(stack, on_stack, node)
                if len(comp) > 1 or any(e.target == node for e in graph.get(node, ())):
                    found.append(sorted(comp))
    return sorted(found)


def _pop_component(stack: list[str], on_stack: set[str], node: str) -> list[str]:
    comp: list[str] = []
    while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == node:
            return comp


def _cycle(graph: Mapping[str, list[Edge]], comp: list[str]) -> Deadlock:
    """One cycle through the group's first job (a breadth-first shortest way back to it)."""
    members, start = set(comp), comp[0]
    came: dict[str, Edge] = {}
    frontier = [start]
    back: Edge | None = None
    while frontier and back is None:
        nxt: list[str] = []
        for node in frontier:
            for e in graph.get(node, ()):
                if e.target not in members:
                    continue
                if e.target == start:
                    back = e
                    break
                if e.target not in came:
                    came[e.target] = e
                    nxt.append(e.target)
            if back is not None:
                break
        frontier = nxt
    assert back is not None  # a strongly connected group always leads back
    path = [back]
    node = back.source
    while node != start:
        e = came[node]
        path.append(e)
        node = e.source
    path.reverse()
    return Deadlock(jobs=tuple(e.source for e in path), edges=tuple(path))
