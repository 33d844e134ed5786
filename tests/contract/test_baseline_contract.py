"""The baseline contract (the BaselineStore port, core/ports.py), on the memory, SQLite and
PostgreSQL stores: samples are kept per (role, kind, metric), oldest first, the latest `window`
of them, and read back by every store instance on the same database."""

from __future__ import annotations

from corral.core.ports import Store
from tests.contract.test_store_contract import NOW, UseStore


def test_baselines_keep_the_latest_samples_per_role_kind_and_metric(use_store: UseStore) -> None:
    async def body(store: Store) -> None:
        assert await store.baselines() == []
        await store.add_baseline_samples(
            [("coder", "claude", "tool_calls", 3.0), ("coder", "claude", "tokens", 900.0)],
            now=NOW,
            window=3,
        )
        await store.add_baseline_samples(
            [("coder", "claude", "tool_calls", v) for v in (4.0, 5.0, 6.0)], now=NOW + 1, window=3
        )
        await store.add_baseline_samples([("aaa", "x", "tool_calls", 1)], now=NOW + 2, window=3)
        found = {(b.role, b.kind, b.metric): b for b in await store.baselines()}
        assert [(b.role, b.metric) for b in await store.baselines()] == [
            ("aaa", "tool_calls"),
            ("coder", "tokens"),
            ("coder", "tool_calls"),
        ]
        calls = found[("coder", "claude", "tool_calls")]
        assert calls.samples == (4.0, 5.0, 6.0) and calls.updated_at == NOW + 1
        assert found[("coder", "claude", "tokens")].samples == (900.0,)
        assert calls.median == 5.0 and not calls.ready  # fewer than five

    use_store(body)
