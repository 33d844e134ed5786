"""W1 with event sinks on against W1 with none, in the same run (docs/how-to/events.md).

    .venv/bin/python bench/events.py [--jobs N] [--repeat N] [--no-redis] [--no-nats]

Starts its own nats-server (JetStream) and redis-server on free loopback ports, then runs W1
(`/bin/true` jobs, concurrency 8, the engine already serving: bench/run.py's `live` mode)
alternately without sinks and with every sink on, `--repeat` times each, and prints the median
jobs/s of each and their ratio (on / off: the drainer must not slow dispatch, so it should stay
near 1; the aim is ≥ 0.95), and the median of the ratios within each round, which the
machine's drift between rounds does not move. After each run with sinks it says how many of
the committed records reached JetStream (all of them: the engine publishes what is left as it
stops). It also prints the engine process's CPU milliseconds per job (its own, not its core's
nor the jobs'), steadier than the rates on a shared machine: what the sinks add to the engine's
loop; and the broker processes' CPU per job, which W1 shares the machine with. Both brokers are
emptied before each round, so each round's events are new to JetStream (its ids restart with
each round's store). Nothing is asserted: timing on a shared machine is for reading.

`--drainer N` measures the drainer alone instead: N jobs submitted to a fresh SQLite store (one
timeline record each), then the engine's drainer (every sink) run round after round in this
process until all of them are out; it prints the CPU microseconds per record, for batches of
`events.batch` (500) and of 20 (about what a live engine's rounds carry), `--repeat` times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/brokers.py, bench/run.py

import nats as nats_client
from bench import run as w1
from redis.asyncio import Redis
from tests.brokers import Broker, jetstream_ids, nats_broker, redis_broker
from tests.contract.test_store_contract import AGING, NOW, make_job

from corral.config import Config, load
from corral.domain.settings import EventsSpec, SinkSpec
from corral.store.sqlite import SqliteStore
from corral.trace.drain import Drainer
from corral.trace.events import SOURCES

_plain_config = w1.write_config


def _with_sinks(sinks: str) -> object:
    def write_config(data: Path, concurrency: int, core: str) -> Config:
        cfg = _plain_config(data, concurrency, core)
        assert cfg.source is not None
        cfg.source.write_text(cfg.source.read_text() + sinks)
        return load(data_dir=data, config_path=cfg.source)

    return write_config


def _brokers_cpu(brokers: list[Broker]) -> float:
    """CPU seconds the broker processes have used so far (they share the machine with W1)."""
    total = 0.0
    for b in brokers:
        st = w1._stat(b.proc.pid) if b.proc is not None else None
        if st is not None:
            total += sum(int(x) for x in st[11:13]) / os.sysconf("SC_CLK_TCK")
    return total


def _fresh_brokers(nats: Broker | None, redis: Broker | None) -> None:
    """Empty both brokers between rounds: every round's events are new to JetStream (ids
    restart with each round's store, and JetStream would drop a repeat as a duplicate, which
    costs it less than storing it) and no round appends to streams another filled."""

    async def reset() -> None:
        if nats is not None:
            nc = await nats_client.connect(f"nats://127.0.0.1:{nats.port}", connect_timeout=2)
            try:
                with contextlib.suppress(nats_client.js.errors.NotFoundError):
                    await nc.jetstream(timeout=5).delete_stream("CORRAL")
            finally:
                await nc.close()
        if redis is not None:
            r = Redis(host="127.0.0.1", port=redis.port)
            try:
                await r.flushall()
            finally:
                await r.aclose()

    asyncio.run(reset())


def _say_published(nats: Broker, db: Path) -> None:
    """How many of the round's committed records JetStream holds (waiting up to 2 minutes)."""
    want = _committed(db)
    t0 = time.monotonic()
    while len(set(jetstream_ids(nats.port))) < want and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    print(
        f"  JetStream: {len(set(jetstream_ids(nats.port)))} of {want}"
        " events (after the engine's final flush)",
        flush=True,
    )


def _committed(db: Path) -> int:
    async def count() -> int:
        store = SqliteStore(db)
        await store.open()
        try:
            return sum([await store.outbox_tip(s) for s in SOURCES])
        finally:
            await store.close()

    return asyncio.run(count())


async def _drainer_cpu(db: Path, sinks: tuple[SinkSpec, ...], records: int, batch: int) -> float:
    """CPU microseconds per record for the drainer to publish `records` committed records."""
    store = SqliteStore(db)
    await store.open()
    try:
        for _ in range(records):
            await store.submit(make_job(), now=NOW, aging_s=AGING)
        drainer = Drainer(store, EventsSpec(sinks=sinks, batch=batch), holder="bench")
        t0 = time.process_time()
        while sum(d.published for d in drainer.sinks) < records * len(sinks):
            for d in drainer.sinks:
                await d.round()
        spent = time.process_time() - t0
        for d in drainer.sinks:
            await d.sink.close()
        return spent * 1e6 / records
    finally:
        await store.close()


def drainer_only(
    root: Path, nats: Broker | None, redis: Broker | None, records: int, repeat: int
) -> int:
    """`--drainer`: the drainer's CPU per record into every sink, for two batch sizes."""
    brokers = [b for b in (nats, redis) if b is not None]
    sinks = tuple(
        SinkSpec(name=kind, kind=kind, url=f"{kind}://127.0.0.1:{b.port}{path}")
        for kind, b, path in (("nats", nats, ""), ("redis", redis, "/0"))
        if b is not None
    )
    try:
        for broker in brokers:
            broker.start()
        _drainer_rounds(root, sinks, records, repeat)
    finally:
        for broker in brokers:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _drainer_rounds(root: Path, sinks: tuple[SinkSpec, ...], records: int, repeat: int) -> None:
    for batch in (500, 20):
        runs = [
            asyncio.run(_drainer_cpu(root / f"drain-{batch}-{i}.db", sinks, records, batch))
            for i in range(repeat)
        ]
        print(
            f"drainer, {len(sinks)} sink(s), batches of {batch}: "
            f"{statistics.median(runs):.0f} us CPU per record "
            f"(runs: {', '.join(f'{r:.0f}' for r in runs)})",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-nats", action="store_true")
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--drainer", type=int, metavar="N", help="the drainer alone, N records")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-bench-events-"))
    brokers: list[Broker] = []
    nats = None if args.no_nats else nats_broker(root / "nats")
    redis = None if args.no_redis else redis_broker(root)
    sinks = "events:\n  sinks:\n"
    if nats is not None:
        brokers.append(nats)
        sinks += f"    - {{kind: nats, url: 'nats://127.0.0.1:{nats.port}'}}\n"
    if redis is not None:
        brokers.append(redis)
        sinks += f"    - {{kind: redis, url: 'redis://127.0.0.1:{redis.port}/0'}}\n"
    if args.drainer:
        return drainer_only(root, nats, redis, args.drainer, args.repeat)
    wl = w1.Workload("W1", args.jobs, 8, "/bin/true", w1._true)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu_ms: dict[str, list[float]] = {"off": [], "on": []}  # the engine's, per job
    broker_ms: list[float] = []  # the brokers', per job, in the rounds with sinks
    try:
        for broker in brokers:
            broker.start()
        for i in range(args.repeat):
            for label in ("off", "on") if i % 2 == 0 else ("on", "off"):
                work = root / f"{label}-{i}"
                work.mkdir()
                w1.write_config = _with_sinks(sinks) if label == "on" else _plain_config
                _fresh_brokers(nats, redis)
                at_start = _brokers_cpu(brokers)
                stats = w1.run_corral_live(wl, work, w1.Options())
                if label == "on":
                    broker_ms.append((_brokers_cpu(brokers) - at_start) * 1000 / args.jobs)
                rates[label].append(stats.jobs_per_s)
                cpu_ms[label].append(stats.extra["cpu_s"]["engine"] * 1000 / args.jobs)
                print(
                    f"round {i + 1} sinks {label:<3}: {stats.jobs_per_s:7.1f} jobs/s,"
                    f" engine {cpu_ms[label][-1]:.2f} ms CPU per job"
                    f" ({stats.failed} not succeeded)",
                    flush=True,
                )
                if label == "on" and nats is not None:
                    _say_published(nats, work / "data" / "corral.db")
    finally:
        w1.write_config = _plain_config
        for broker in brokers:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(
        f"W1 {args.jobs} jobs: sinks off {off:.1f} jobs/s, sinks on {on:.1f} jobs/s, "
        f"ratio on/off {on / off if off else 0:.3f}"
    )
    # Each round ran both, back to back: the ratio within a round is not moved by the machine
    # getting faster or slower between rounds (this one's rates varied by half on a quiet VM)
    pairs = sorted(a / b for a, b in zip(rates["on"], rates["off"], strict=True) if b)
    if pairs:
        print(
            f"ratio on/off within each round: median {statistics.median(pairs):.3f}"
            f" (from {pairs[0]:.3f} to {pairs[-1]:.3f}, {len(pairs)} rounds)"
        )
    c_off, c_on = statistics.median(cpu_ms["off"]), statistics.median(cpu_ms["on"])
    print(
        f"engine CPU per job: sinks off {c_off:.2f} ms, sinks on {c_on:.2f} ms, "
        f"ratio off/on {c_off / c_on if c_on else 0:.3f}"
    )
    if broker_ms:
        print(f"brokers' CPU per job with sinks on: {statistics.median(broker_ms):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
