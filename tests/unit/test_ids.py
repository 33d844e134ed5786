"""Ids sort by creation time and do not collide."""

from __future__ import annotations

from corral.domain.ids import new_id


def test_ids_sort_by_millisecond_and_are_unique() -> None:
    ids = [new_id(ms) for ms in (1, 2, 1_700_000_000_000, 1_700_000_000_001, 2**47)]
    assert ids == sorted(ids)
    assert all(len(i) == 26 and i.isalnum() and i == i.lower() for i in ids)
    many = {new_id(5) for _ in range(10_000)}
    assert len(many) == 10_000
