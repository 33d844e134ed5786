"""The domain values the core protocol carries (docs/reference/core-protocol.md): a job (with
its limits), an attempt, a permit and an attempt's result. Times are epoch seconds.

Every one is its domain dataclass on the wire: a permit, a result and a job's limits whole
(`PERMIT`, `RESULT`), a job and an attempt as a projection of their fields in a fixed order
(`JOB`, `ATTEMPT`), so the domain's types are the protocol's and the two cannot drift. A reader
is tolerant: a field it does not know is ignored, so an older core reads a newer scheduler's
message. core/protocol.py encodes and decodes with these and nothing else."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

from corral.domain import models as dm
from corral.domain.states import DedupMode

T = TypeVar("T")

# A permit and a result travel whole
PERMIT: TypeAdapter[dm.Permit] = TypeAdapter(dm.Permit)
RESULT: TypeAdapter[dm.AttemptResult] = TypeAdapter(dm.AttemptResult)


class _Wire(BaseModel):
    # a number where a string is expected is read as its text, as the protocol always did
    model_config = ConfigDict(
        extra="ignore", frozen=True, coerce_numbers_to_str=True, defer_build=True
    )


class Projection(Generic[T]):
    """Some fields of a domain dataclass, in a fixed order, as one model on the wire.

    A field has the dataclass's type and default; `overrides` gives (type, default) where the
    wire differs (a job's options are their JSON object; fields a sender may leave out)."""

    def __init__(
        self,
        cls: type[T],
        name: str,
        names: tuple[str, ...],
        *,
        overrides: Mapping[str, tuple[Any, Any]] | None = None,
        doc: str = "",
    ) -> None:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        spec: dict[str, Any] = {
            n: (overrides or {}).get(n) or (hints[n], _default(fields[n])) for n in names
        }
        self.names = names
        self.model: type[BaseModel] = create_model(name, __base__=_Wire, __doc__=doc, **spec)

    def dump(self, value: T, **wire: Any) -> dict[str, Any]:
        """`value`'s fields as JSON, `wire` in place of those whose wire form differs."""
        data = {n: wire[n] if n in wire else getattr(value, n) for n in self.names}
        return self.model.model_validate(data).model_dump(mode="json")

    def load(self, data: Any) -> dict[str, Any]:
        """The fields a message holds, validated (pydantic's ValidationError if not)."""
        return dict(self.model.model_validate(data))


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return Field(default_factory=f.default_factory)
    return ...


_OPTIONAL = (str | None, None)  # a field the sender may leave out

JOB: Projection[dm.Job] = Projection(
    dm.Job,
    "ProtocolJob",
    (
        "id",
        "state",
        "role",
        "worker",
        "env_name",
        "priority",
        "tenant",
        "command",
        "prompt",
        "cwd",
        "env",
        "options",
        "limits",
        "key",
        "dedup",
        "workspace",
        "parent_id",
        "depth",
        "created_at",
        "updated_at",
        "sort_at",
        "attempts",
        "cancel_requested",
        "stop_kind",
    ),
    overrides={
        "prompt": _OPTIONAL,
        "cwd": _OPTIONAL,
        "key": _OPTIONAL,
        "workspace": _OPTIONAL,
        "parent_id": _OPTIONAL,
        "depth": (int, 0),
        "dedup": (DedupMode, DedupMode.COALESCE),
        "env": (dict[str, str], Field(default_factory=dict)),
        "options": (
            dict[str, Any],
            Field(
                default_factory=dict,
                description="Only the options that are set "
                "(domain/models.py JobOptions); keys a reader does not know are kept.",
            ),
        ),
    },
    doc="A job as the scheduler hands it to the core: what decides what runs and what it is "
    "charged to, and the bookkeeping the core's checks read.",
)

ATTEMPT: Projection[dm.Attempt] = Projection(
    dm.Attempt,
    "ProtocolAttempt",
    (
        "id",
        "job_id",
        "index",
        "state",
        "permit_id",
        "deadline_at",
        "created_at",
        "dir",
        "engine_id",
        "pid",
    ),
    doc="An attempt as the scheduler created it, before it runs.",
)
