"""What the knowledge flywheel adds to an agent dispatch, in a SQLite store holding many
learnings.

    .venv/bin/python bench/knowledge.py [--learnings 5000] [--dispatches 200] [--out FILE]

Fills a fresh store (in a temporary directory) with `--learnings` active learnings of one role
(texts drawn from a small vocabulary, so the full-text search finds many), then times
`--dispatches` calls of what dispatch does for a role with `knowledge: on`
(runtime/flywheel.py `inject`: the FTS5 search of the prompt's words, the ranking, the budget,
and the write of the run's arm and citations) against, in the same run, a plain indexed read
of the role's 50 newest learnings (the baseline). Prints p50/p99 in ms and the ratio of the
p50s; the figure to watch is the inject p99 against the dispatch it delays (an agent attempt
takes seconds)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from corral.domain.knowledge import LearningStatus
from corral.domain.models import Attempt, Claimed, Job, JobOptions, Limits, Permit
from corral.domain.settings import KnowledgeSpec, RoleSpec, Settings
from corral.domain.states import AttemptState, DedupMode, JobState
from corral.runtime.flywheel import Flywheel
from corral.store.sqlite import SqliteStore

WORDS = [
    "pytest",
    "ruff",
    "mypy",
    "docker",
    "cache",
    "seed",
    "flaky",
    "fixture",
    "import",
    "timeout",
    "retry",
    "lock",
    "schema",
    "migration",
    "index",
    "query",
    "socket",
    "deadline",
    "token",
    "budget",
    "branch",
    "commit",
    "worktree",
    "lint",
    "test",
]


def claimed(i: int, prompt: str) -> Claimed:
    now = time.time()
    job = Job(
        id=f"bench-{i:06}",
        state=JobState.STARTING,
        role="coder",
        worker="claude-code",
        env_name="local",
        priority=0,
        tenant="default",
        command=(),
        prompt=prompt,
        cwd=None,
        env={},
        options=JobOptions(),
        limits=Limits(),
        key=None,
        dedup=DedupMode.COALESCE,
        workspace=None,
        parent_id=None,
        depth=0,
        created_at=now,
        updated_at=now,
        sort_at=now,
    )
    attempt = Attempt(
        id=f"{job.id}.1",
        job_id=job.id,
        index=1,
        state=AttemptState.STARTING,
        permit_id="p",
        deadline_at=now + 60,
        created_at=now,
        dir="/tmp/none",
        engine_id="bench",
    )
    permit = Permit(
        id="p",
        job_id=job.id,
        attempt_index=1,
        issued_at=now,
        deadline_at=now + 60,
        grace_s=1,
        granted={},
        breaker="CLOSED",
        seal="s",
    )
    return Claimed(job=job, attempt=attempt, permit=permit)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def main(args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(7)
    settings = Settings(
        roles={"coder": RoleSpec(name="coder", worker="claude-code", knowledge="on")},
        environments={},
        knowledge=KnowledgeSpec(),
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "corral.db")
        await store.open()
        wheel = Flywheel(store, settings)
        seed = Flywheel(store, settings)  # writes learnings as the reporter would
        from tests.unit.test_flywheel import agent_job, event  # a run's trace, as in the tests

        for i in range(args.learnings):
            job = agent_job(id=f"seed-{i:06}")
            text = f"The {sentence(rng, 3)} failure was fixed by {sentence(rng, 8)} in a.py."
            await seed.settle(job, [event(job, final=text)])
        active = await store.list_learnings(role="coder", status=LearningStatus.ACTIVE, limit=1)
        assert active, "no active learning was written"
        base: list[float] = []
        inject: list[float] = []
        for i in range(args.dispatches):
            prompt = f"fix the {sentence(rng, 4)} please"
            t = time.perf_counter()
            await store.list_learnings(role="coder", status=LearningStatus.ACTIVE, limit=50)
            base.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            c = await wheel.inject(claimed(i, prompt))
            inject.append((time.perf_counter() - t) * 1000)
            assert c.job.options.knowledge, "nothing was injected"
        await store.close()

    def q(xs: list[float], p: int) -> float:
        return statistics.quantiles(xs, n=100)[p - 1]

    out: dict[str, float] = {
        "learnings": args.learnings,
        "baseline_p50_ms": statistics.median(base),
        "baseline_p99_ms": q(base, 99),
        "inject_p50_ms": statistics.median(inject),
        "inject_p99_ms": q(inject, 99),
    }
    out["ratio_p50"] = out["inject_p50_ms"] / out["baseline_p50_ms"]
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--learnings", type=int, default=5000)
    ap.add_argument("--dispatches", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = json.dumps(asyncio.run(main(args)), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
