"""Exit codes are decided at the CLI edge from an error's machine code (cli/exits.py); these are
the codes docs/reference/cli.md#exit-codes promises, error by error."""

from __future__ import annotations

import pytest

from corral.cli.exits import EXIT_CODES, exit_code
from corral.client import errors as client_errors
from corral.core.link import CoreUnavailable
from corral.core.protocol import ProtocolError
from corral.domain import errors
from corral.domain.errors import CorralError


@pytest.mark.parametrize(
    ("err", "code", "exit"),
    [
        (errors.ConfigError("x"), "config_invalid", 2),
        (errors.InvalidRequest("x"), "invalid_request", 2),
        (errors.NotFound("x"), "not_found", 4),
        (errors.Conflict("x"), "conflict", 5),
        (errors.DuplicateJob("k", "j1"), "duplicate_key", 5),  # a conflict, with a code of its own
        (errors.Backpressure("x", 1.0), "backpressure", 75),
        (errors.StoreError("x"), "store_unavailable", 3),
        (errors.StoreBroken("x"), "store_broken", 3),
        (errors.StaleState("x"), "stale_state", 1),
        (errors.PermitError("x"), "permit_refused", 1),
        (errors.WorkerError("x"), "worker_failed", 1),
        (errors.WorkerMisconfigured("x"), "worker_misconfigured", 1),
        (errors.EngineRunning("x"), "engine_running", 6),
        (errors.NotPermitted("x"), "not_permitted", 10),
        (errors.EngineFenced("x"), "engine_fenced", 3),
        (errors.EngineNotRunning("x"), "engine_not_running", 7),
        (ProtocolError("x"), "protocol_error", 1),
        (CoreUnavailable("x"), "core_unavailable", 1),
        (CorralError("x"), "error", 1),
    ],
)
def test_every_error_has_a_code_and_the_documented_exit_code(
    err: CorralError, code: str, exit: int
) -> None:
    assert err.code == code
    assert exit_code(err) == exit


def test_no_domain_error_carries_an_exit_code_of_its_own() -> None:
    """How to exit is the edge's business: the domain's classes hold a machine code only."""
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, CorralError):
            assert not hasattr(cls, "exit_code"), cls.__name__


def test_the_table_names_only_codes_some_error_has() -> None:
    def subclasses(cls: type[CorralError]) -> list[type[CorralError]]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    codes = {cls.code for cls in subclasses(CorralError)}
    assert set(EXIT_CODES) <= codes


@pytest.mark.parametrize(
    ("status", "code", "exit"),
    [
        (404, "not_found", 4),
        (409, "conflict", 5),
        (403, "not_permitted", 10),
        (401, "unauthenticated", 10),
        (429, "backpressure", 75),
        (429, "rate_limited", 75),
        (422, "invalid_request", 2),
        (503, "store_unavailable", 3),
        (0, "unreachable", 7),
        (500, "internal", 1),
    ],
)
def test_a_remote_engines_error_exits_as_the_same_error_would_locally(
    status: int, code: str, exit: int
) -> None:
    """With --url the CLI gets the API's problem answers: their code picks the exit code."""
    import httpx

    answer = httpx.Response(
        status or 500, json={"type": "t", "code": code, "detail": "d", "status": status}
    )
    err = (
        client_errors.unreachable("http://x", OSError("refused"))
        if status == 0
        else client_errors.from_response(answer)
    )
    assert err.code == code and exit_code(err) == exit
