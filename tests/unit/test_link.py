"""The core protocol between a scheduler's link and a core server, in process and deterministic:
bad input, permits over the wire, and a core restart under a waiting scheduler."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from corral.core import protocol as p
from corral.core.gateway import Core
from corral.core.link import CoreLink, CoreUnavailable, connect_local
from corral.core.permits import PermitGate
from corral.core.ports import AttemptRef
from corral.core.server import CoreServer
from corral.domain.models import Attempt, AttemptResult, Claimed, Job, Limits, Permit
from corral.domain.states import AttemptState, Outcome
from tests.unit.test_dispatcher import SETTINGS, FakeWorker
from tests.unit.test_retry import job


def _core(result: AttemptResult | None = None, hold: bool = True) -> tuple[Core, FakeWorker]:
    gate = PermitGate(SETTINGS)
    worker = FakeWorker(
        gate.validate,
        lambda j, i: result or AttemptResult(outcome=Outcome.EXITED, exit_code=0),
        hold=hold,
    )
    return Core(gate, {"command": worker}), worker


def _attempt(j: Job, permit: Permit) -> Attempt:
    return Attempt(
        id="a1",
        job_id=j.id,
        index=1,
        state=AttemptState.STARTING,
        permit_id=permit.id,
        deadline_at=permit.deadline_at,
        created_at=1.0,
        dir="/nonexistent",
        engine_id="e",
    )


def test_bad_lines_get_error_replies_and_change_nothing() -> None:
    async def main() -> None:
        core, _ = _core()
        sent: list[dict[str, Any]] = []

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        async with anyio.create_task_group() as tg:
            server = CoreServer(core, send, lambda: 1.0)
            server.attach(tg)
            for line in (
                b"{nope",
                b"[]",
                b'{"type": 3}',
                p.OVERSIZED,
                b'{"type": "fly", "id": 4}',
                b'{"type": "submit_job", "id": 5}',
            ):
                await server.handle_line(line)
            tg.cancel_scope.cancel()
        assert [m["type"] for m in sent] == ["error"] * 6
        assert sent[4] == {"type": "error", "id": 4, "error": "unknown message type 'fly'"}
        assert sent[5]["id"] == 5 and "job" in sent[5]["error"]
        assert core.gate.live == 0

    anyio.run(main)


def test_a_request_that_meets_a_bug_is_answered_and_the_core_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core, _ = _core()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(core, "report_cost", broken)

    async def main() -> None:
        sent: list[dict[str, Any]] = []

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        async with anyio.create_task_group() as tg:
            server = CoreServer(core, send, lambda: 1.0)
            server.attach(tg)
            await server.handle_line(
                b'{"type": "report_cost", "id": 1, "job_id": "j1", "cost_usd": 0.5}'
            )
            await server.handle_line(b'{"type": "heartbeat", "id": 2, "seq": 1}')
            tg.cancel_scope.cancel()
        assert sent[0] == {
            "type": "error",
            "id": 1,
            "error": "internal error handling report_cost: KeyError",
        }
        assert sent[1]["type"] == "heartbeat" and sent[1]["id"] == 2

    anyio.run(main)


def test_a_forged_release_cannot_free_a_real_permit() -> None:
    async def main() -> None:
        core, _ = _core()
        link = CoreLink()
        async with anyio.create_task_group() as tg:
            connect_local(link, core, tg, lambda: 1.0)
            j = job(id="j1", role="default")
            permit = await link.request_permit(j, 1)
            assert isinstance(permit, Permit)
            forged = dataclasses.replace(permit, seal="0" * 64)
            with pytest.raises(Exception, match="forged"):
                await link.release(forged)
            assert core.gate.live == 1
            await link.release(permit)
            assert core.gate.live == 0
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_scheduler_waiting_on_a_result_survives_a_core_restart() -> None:
    async def main() -> None:
        first, worker = _core(hold=True)
        link = CoreLink()
        j = job(id="j1", role="default")
        async with anyio.create_task_group() as tg:
            connect_local(link, first, tg, lambda: 1.0)
            permit = await link.request_permit(j, 1)
            assert isinstance(permit, Permit)
            c = Claimed(job=j, attempt=_attempt(j, permit), permit=permit)
            ref = await link.submit(c)
            assert isinstance(ref, AttemptRef) and ref.kind == "pid"
            assert isinstance(ref.pid, int) and ref.pid >= 1000
            got: list[AttemptResult] = []

            async def wait() -> None:
                got.append(await link.result(j.id))

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            link.disconnect("core died")  # the old core is gone; its attempt keeps running
            with pytest.raises(CoreUnavailable):
                await link.request_permit(job(id="j2", role="default"), 1)
            assert got == []
            second, second_worker = _core()
            # it ended while no core watched: the new core finds its result on adoption
            second_worker.adoptable[c.attempt.id] = AttemptResult(
                outcome=Outcome.EXITED, exit_code=0
            )
            connect_local(link, second, tg, lambda: 2.0)
            await link.readopt(j, c.attempt)  # the new core adopts it and reports its end
            with anyio.fail_after(5):
                while not got:
                    await anyio.wait_all_tasks_blocked()
            assert got[0].outcome is Outcome.EXITED
            assert second.gate.live == 0, "the adopted permit was released by the new core"
            assert worker.handles, "the first core really started the attempt"
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_refused_submit_reaches_the_scheduler_as_an_attempt_that_never_ran() -> None:
    async def main() -> None:
        core, worker = _core()
        link = CoreLink()
        now = [1000.0]
        j = job(id="j1", role="default", limits=Limits(timeout_s=5.0))
        async with anyio.create_task_group() as tg:
            connect_local(link, core, tg, lambda: now[0])
            permit = await link.request_permit(j, 1)
            assert isinstance(permit, Permit)
            other = job(id="j2", role="default", limits=Limits(timeout_s=5.0))
            misused = await link.submit(
                Claimed(job=other, attempt=_attempt(other, permit), permit=permit)
            )
            assert isinstance(misused, AttemptResult)
            assert misused.outcome is Outcome.LOST, "nothing started: retried within bounds"
            assert misused.error is not None and "(PERMIT_WRONG_JOB)" in misused.error
            now[0] = 1005.0  # its deadline passed before the scheduler used it
            late = await link.submit(Claimed(job=j, attempt=_attempt(j, permit), permit=permit))
            assert isinstance(late, AttemptResult) and late.outcome is Outcome.LOST
            assert "PERMIT_EXPIRED" in (late.error or "")
            assert worker.handles == {}, "nothing started"
            other_job = job(id="j3", role="default")
            used = await link.request_permit(other_job, 1)
            assert isinstance(used, Permit)
            c = Claimed(job=other_job, attempt=_attempt(other_job, used), permit=used)
            assert isinstance(await link.submit(c), AttemptRef)
            twice = await link.submit(c)  # something runs under it: never retried
            assert isinstance(twice, AttemptResult) and twice.outcome is Outcome.SPAWN_ERROR
            assert len(worker.handles) == 1
            await link.cancel("j1")  # no running attempt: answered, and nobody waits on it
            assert not link.errors
            tg.cancel_scope.cancel()

    anyio.run(main)
