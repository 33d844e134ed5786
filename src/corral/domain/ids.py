"""Time-ordered ids: 48-bit milliseconds + 80 random bits, in lowercase Crockford base32."""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Iterable

from corral.domain.errors import InvalidRequest, NotFound

# RFC 4648 base32 digits, in value order, onto Crockford's (also in ASCII order): ids made in
# a later millisecond sort after earlier ones as plain strings.
_CROCKFORD = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", b"0123456789abcdefghjkmnpqrstvwxyz"
)


_RANDOM = 1 << 80
_last = (-1, 0)  # the millisecond and the random part of this process's latest id
_made = threading.Lock()


def _forked() -> None:  # a forked child must not make its parent's next id
    global _last, _made
    _last, _made = (-1, 0), threading.Lock()


os.register_at_fork(after_in_child=_forked)


def new_id(now_ms: int | None = None) -> str:
    """A 26-character id that sorts by creation time: by its millisecond, and within one
    millisecond of one process by the order they were made (the random part of the previous
    id, plus one: a burst of jobs lists newest first like any other)."""
    global _last
    ms = (int(time.time() * 1000) if now_ms is None else now_ms) & 0xFFFF_FFFF_FFFF
    with _made:
        last_ms, last_random = _last
        if ms == last_ms and last_random + 1 < _RANDOM:
            random = last_random + 1
        else:
            random = int.from_bytes(os.urandom(10), "big")
        _last = (ms, random)
    raw = ms.to_bytes(6, "big") + random.to_bytes(10, "big")
    return base64.b32encode(raw)[:26].translate(_CROCKFORD).decode()


def id_floor(at: float) -> str:
    """The least id `new_id` can make at or after `at` (seconds): ids made since `at` are the
    ids >= this one."""
    raw = (int(at * 1000) & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + bytes(10)
    return base64.b32encode(raw)[:26].translate(_CROCKFORD).decode()


# A reference to an id: the whole id, or a unique prefix or suffix of at least MIN_REF
# characters. Ids are time-ordered, so ids made close together share their first characters
# and differ at the end: tables print the shortest unique suffix, of at least SHORT_MIN
# characters so that it stays unique while more ids are made (docs/reference/cli.md).
MIN_REF = 4
SHORT_MIN = 6


def matches(ref: str, candidate: str) -> bool:
    """Whether `ref` names `candidate`: equal, or a prefix or suffix of at least MIN_REF."""
    if ref == candidate:
        return True
    return len(ref) >= MIN_REF and (candidate.startswith(ref) or candidate.endswith(ref))


def resolve(ref: str, ids: Iterable[str], what: str = "job") -> str:
    """The one id among `ids` that `ref` names; NotFound, or InvalidRequest when ambiguous."""
    found = sorted({i for i in ids if matches(ref, i)})
    if ref in found:
        return ref
    if not found:
        raise NotFound(f"no {what} {ref}")
    if len(found) > 1:
        raise InvalidRequest(
            f"{what} id {ref!r} is ambiguous: it names "
            f"{', '.join(found[:5])}{' …' if len(found) > 5 else ''}"
        )
    return found[0]


def shortest(wanted: Iterable[str], everything: Iterable[str]) -> dict[str, str]:
    """Each wanted id's shortest suffix (at least SHORT_MIN long) that names no other id of
    `everything`, neither as a suffix nor as a prefix."""
    others = list(everything)
    out = {}
    for i in wanted:
        n = min(SHORT_MIN, len(i))
        while n < len(i) and any(
            o != i and (o.endswith(i[-n:]) or o.startswith(i[-n:])) for o in others
        ):
            n += 1
        out[i] = i[-n:]
    return out


def wandb_run_id(job_id: str, attempt_index: int) -> str:
    """The W&B run id of a job's attempt: `corral-<job id>-<attempt index>`. The one place it is
    derived: the training worker sets `WANDB_RUN_ID` from it and `corral replay <wandb run id>`
    reads a job back out of it (`job_of_wandb_run_id`)."""
    return f"corral-{job_id}-{attempt_index}"


def job_of_wandb_run_id(run_id: str) -> tuple[str, int] | None:
    """The job id and attempt index a W&B run id made by `wandb_run_id` names, else None."""
    prefix, _, rest = run_id.partition("-")
    job_id, _, index = rest.rpartition("-")
    if prefix != "corral" or not job_id or not index.isdigit():
        return None
    return job_id, int(index)
