"""Typed job options (domain/models.py JobOptions): the JSON the store and the core protocol
hold is the object it always was, and a row another version wrote reads back whole."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from corral.domain.models import JobOptions


def test_only_the_options_that_are_set_are_written() -> None:
    assert JobOptions().to_json() == {}
    opts = JobOptions(
        resume_from="j1", session_root="j0", secret_env=("A", "B"), detached=True, provider="openai"
    )
    assert opts.to_json() == {
        "resume_from": "j1",
        "session_root": "j0",
        "secret_env": ["A", "B"],
        "detached": True,
        "provider": "openai",
    }


def test_every_field_round_trips_through_json() -> None:
    opts = JobOptions(
        resume_from="a",
        session_root="b",
        resume_session="c",
        secret_env=("X",),
        sealed="v1.zz",
        detached=True,
        workflow="w",
        provider="p",
        model="m",
        submitted_by="token:t1",
        epic="e1/a/1",
        knowledge="## Learnings …",
        extract_of="j1/1/",
    )
    assert JobOptions.from_json(opts.to_json()) == opts
    names = {f.name for f in dataclasses.fields(JobOptions)} - {"extra"}
    assert names == set(opts.to_json()), "every field has its JSON key"


@pytest.mark.parametrize(
    "stored",
    [
        {"future_option": {"x": [1]}},  # a key this version does not know
        {"workflow": 7},  # a known key with a value of another type
        {"secret_env": ["A", 3]},
        {"detached": "yes"},
    ],
)
def test_what_this_version_cannot_read_is_kept_as_read(stored: dict[str, Any]) -> None:
    opts = JobOptions.from_json(stored)
    assert opts == JobOptions(extra=stored)
    assert opts.to_json() == stored, "written back unchanged"
