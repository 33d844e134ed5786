"""Ids sort by creation time and do not collide."""

from __future__ import annotations

import os

import pytest

from corral.domain.errors import InvalidRequest, NotFound
from corral.domain.ids import job_of_wandb_run_id, new_id, resolve, shortest, wandb_run_id


def test_ids_sort_by_millisecond_and_are_unique() -> None:
    ids = [new_id(ms) for ms in (1, 2, 1_700_000_000_000, 1_700_000_000_001, 2**47)]
    assert ids == sorted(ids)
    assert all(len(i) == 26 and i.isalnum() and i == i.lower() for i in ids)
    many = {new_id(5) for _ in range(10_000)}
    assert len(many) == 10_000
    # within one millisecond of one process: in the order they were made
    burst = [new_id(7) for _ in range(1_000)]
    assert burst == sorted(burst) and len(set(burst)) == 1_000
    assert new_id(6) < burst[0] < new_id(8)


def test_a_forked_child_does_not_make_its_parents_next_id() -> None:
    new_id(9)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id of the same millisecond, to the parent
        os.write(write, new_id(9).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    assert len(child) == 26 and child != new_id(9)


A = "06h0n33sb74qz84115d9eee97g"
B = "06h0n33pwpj0txdm552bqkjtjg"
C = "06h0n34yn1bhx7npy46wy6z97g"  # ends like A for three characters


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (A, A),
        ("06h0n33s", A),
        ("ee97g", A),
        ("d9eee97g", A),
        ("tjg", None),  # 3: too short
        ("jtjg", B),
        ("06h0n34", C),
        ("zzzzzz", None),
        ("%%%%", None),
    ],
)
def test_a_reference_is_the_id_or_a_unique_prefix_or_suffix(ref: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(NotFound):
            resolve(ref, [A, B, C])
    else:
        assert resolve(ref, [A, B, C]) == expected


@pytest.mark.parametrize("ref", ["06h0n3", "06h0"])
def test_an_ambiguous_reference_names_the_candidates(ref: str) -> None:
    with pytest.raises(InvalidRequest, match="ambiguous: it names 06h0n3"):
        resolve(ref, [A, B, C, "06h0n3zzzz97g"])


def test_the_short_form_is_the_shortest_unique_suffix_of_six_or_more() -> None:
    assert shortest([A, B, C], [A, B, C]) == {A: A[-6:], B: B[-6:], C: C[-6:]}
    twin = "06h0n35000000000000d9eee97g"  # ends with A's last 8 characters
    assert twin.endswith(A[-8:]) and not twin.endswith(A[-9:])
    assert shortest([A], [A, twin]) == {A: A[-9:]}
    head = A[-6:] + "0" * 20  # a prefix that reads like A's suffix
    assert shortest([A], [A, head])[A] == A[-7:]


def test_a_wandb_run_id_names_its_job_and_attempt_and_reads_back() -> None:
    assert wandb_run_id(A, 3) == f"corral-{A}-3"
    assert job_of_wandb_run_id(wandb_run_id(A, 3)) == (A, 3)
    assert job_of_wandb_run_id(wandb_run_id(A, 12)) == (A, 12)


@pytest.mark.parametrize(
    "ref",
    [A, "corral-", f"corral-{A}", f"corral-{A}-", f"corral-{A}-x1", f"ray-{A}-1", "corral--1"],
)
def test_what_is_no_wandb_run_id_reads_as_none(ref: str) -> None:
    assert job_of_wandb_run_id(ref) is None
