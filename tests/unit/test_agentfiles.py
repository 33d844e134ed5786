"""A file an agent wrote is read as a regular file of its folder and nothing else
(workers/agentfiles.py): a link to another file is refused, not followed; a FIFO is refused
without waiting on it; past the limit only one byte more is read. The decomposer's proposal,
the judges' verdicts and the extractor's learnings are read through it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.domain.models import Job
from corral.services import escalate
from corral.services.waveparts import verdict_of
from corral.waves.decompose import ProposalError
from corral.waves.rules import Verdict
from corral.workers.agentfiles import read_agent_file
from tests.contract.test_store_contract import make_job


def test_a_regular_file_is_read_up_to_one_byte_past_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "out.json"
    f.write_bytes(b"x" * 10)
    assert read_agent_file(f, 64) == b"x" * 10
    assert read_agent_file(f, 4) == b"xxxxx"  # one past: the caller says it is too large


def test_a_link_and_a_fifo_are_refused_not_followed_nor_waited_on(tmp_path: Path) -> None:
    secret = tmp_path / "engine-only.txt"
    secret.write_text("not for the agent")
    link = tmp_path / "proposal.json"
    link.symlink_to(secret)
    with pytest.raises(OSError, match="symbolic link"):
        read_agent_file(link, 1024)
    fifo = tmp_path / "verdict.json"
    os.mkfifo(fifo)  # no writer: a plain open would wait for one forever
    with pytest.raises(OSError, match="not a regular file"):
        read_agent_file(fifo, 1024)


def test_a_proposal_or_a_verdict_through_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"verdict": "PASS", "confidence": "high", "key_insight": "x"}')
    proposal = tmp_path / "proposal.json"
    proposal.symlink_to(elsewhere)
    with pytest.raises(ProposalError, match=r"no valid proposal\.json: .*symbolic link"):
        escalate._proposal(proposal)
    verdict = tmp_path / "verdict.json"
    verdict.symlink_to(elsewhere)
    judge: Job = make_job()
    got = verdict_of(verdict, judge)
    assert got.verdict is Verdict.FAIL and "no valid verdict.json" in got.key_insight
    assert "symbolic link" in got.key_insight
