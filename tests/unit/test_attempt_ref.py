"""An attempt handle's reference (core/ports.py `AttemptRef`): opaque to all but its worker,
a pid only for a local process."""

from __future__ import annotations

import pytest

from corral.core.ports import AttemptRef


def test_a_local_process_is_its_pid() -> None:
    ref = AttemptRef.local(1234)
    assert (str(ref), ref.pid, ref.describe()) == ("pid:1234", 1234, "pid 1234")
    assert AttemptRef.parse(str(ref)) == ref


def test_a_remote_job_has_no_pid() -> None:
    ref = AttemptRef.parse("ray:raysubmit_AbC:1")  # the id may hold a colon of its own
    assert (ref.kind, ref.id, ref.pid) == ("ray", "raysubmit_AbC:1", None)
    assert ref.describe() == str(ref) == "ray:raysubmit_AbC:1"


@pytest.mark.parametrize("text", ["", "1234", ":1234", "pid:"])
def test_a_reference_names_its_kind_and_id(text: str) -> None:
    with pytest.raises(ValueError, match="is not <kind>:<id>"):
        AttemptRef.parse(text)
