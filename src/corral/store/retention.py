"""What the memory and SQL retention (store/retention_memory.py, store/retention_sql.py) share:
the tables a job's rows live in, the rollup series that keep its figures once it is gone, and the
shape of a chain segment."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from corral.core.ports import ARCHIVED_CHAINS, ChainHead
from corral.domain.states import JobState

TERMINAL = tuple(s.value for s in JobState if s.terminal)

# (table, the column naming the job), the job's own row first: deleted in the reverse order.
JOB_TABLES = (
    ("jobs", "id"),
    ("attempts", "job_id"),
    ("agent_events", "job_id"),
    ("checkpoints", "job_id"),
    ("job_deps", "job_id"),
    ("workspace_waits", "job_id"),
)

# metric_rollups series holding what removed jobs counted (store/metrics_sql.py reads them);
# `role` holds the labels joined by SEP.
GONE_JOBS = "gone_jobs"  # (role, environment, priority, state): n jobs
GONE_TOKENS_IN = "gone_tokens_in"  # (role, tenant, worker): n tokens in, total cost in USD
GONE_TOKENS_OUT = "gone_tokens_out"  # (role, tenant, worker): n tokens out
GONE_TOOLS = "gone_tool_calls"  # (verdict, reason): n tool-call evaluations
GONE = (GONE_JOBS, GONE_TOKENS_IN, GONE_TOKENS_OUT, GONE_TOOLS)
SEP = "\x1f"


def label(*parts: Any) -> str:
    return SEP.join(str(p) for p in parts)


def labels(key: str) -> tuple[str, ...]:
    return tuple(key.split(SEP))


def segments_of(
    rows: Mapping[str, tuple[Mapping[str, Any], ...]], base: Mapping[str, ChainHead]
) -> dict[str, tuple[ChainHead, ChainHead]]:
    """Each archived chain's segment: (the head archived before, the last row's seq and hash)."""
    out = {}
    for table in ARCHIVED_CHAINS:
        seg = rows.get(table, ())
        end = ChainHead(int(seg[-1]["seq"]), str(seg[-1]["hash"])) if seg else base[table]
        out[table] = (base[table], end)
    return out


def segments_json(segments: Mapping[str, tuple[ChainHead, ChainHead]]) -> str:
    return json.dumps(
        {t: [a.seq, a.hash, b.seq, b.hash] for t, (a, b) in sorted(segments.items())},
        sort_keys=True,
    )


Usage = tuple[tuple[str, ...], int, int, float]


def merge_usage(live: Iterable[Usage], gone: Iterable[Mapping[str, Any]]) -> tuple[Usage, ...]:
    """Token and cost sums of the jobs in the store plus those retention removed (rollup rows
    of the GONE_TOKENS_* series), by (role, tenant, worker)."""
    sums: dict[tuple[str, ...], list[float]] = {}
    for key, tin, tout, cost in live:
        entry = sums.setdefault(key, [0, 0, 0.0])
        entry[0] += tin
        entry[1] += tout
        entry[2] += cost
    for r in gone:
        if r["series"] == GONE_TOKENS_IN:
            entry = sums.setdefault(labels(r["role"]), [0, 0, 0.0])
            entry[0] += int(r["n"])
            entry[2] += float(r["total"])
        elif r["series"] == GONE_TOKENS_OUT:
            entry = sums.setdefault(labels(r["role"]), [0, 0, 0.0])
            entry[1] += int(r["n"])
    return tuple((k, int(v[0]), int(v[1]), float(v[2])) for k, v in sorted(sums.items()))
