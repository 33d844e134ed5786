"""The reporter keeps going past a job whose records it cannot read (a row written by a newer
version, a hand edit): that job is left without a report and said once; the rest are written.
It stopped the engine ("internal error") before."""

from __future__ import annotations

import logging

import anyio
import pytest

from corral.domain.models import Attempt
from corral.runtime.reporter import Reporter
from corral.store.memory import MemoryStore
from tests.contract.test_governance_contract import ended


class OneBadJob(MemoryStore):
    bad = ""

    async def attempts(self, job_id: str) -> list[Attempt]:
        if job_id == self.bad:
            raise ValueError("'ENDED' is not a valid AttemptState")
        return await super().attempts(job_id)


def test_a_job_it_cannot_read_is_skipped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        store = OneBadJob()
        bad, good = await ended(store), await ended(store)
        store.bad = bad.id
        reporter = Reporter(store)
        with caplog.at_level(logging.ERROR, logger="corral.reporter"):
            await reporter.catch_up()
            await reporter.catch_up()
            await reporter.flush()  # a draining engine's last look ends, too
        assert await store.report(good.id) is not None
        assert await store.report(bad.id) is None
        assert await store.unreported() == [bad.id]
        said = [r for r in caplog.records if bad.id in r.getMessage()]
        assert len(said) == 1 and "cannot be read" in said[0].getMessage()

    anyio.run(main)
