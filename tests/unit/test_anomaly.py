"""Anomaly detection: the pure check against a rolling baseline (too few samples say nothing, a
median of 0 says nothing, only past factor × median counts), the reporter learning each clean
attempt's figures, and the world watch flagging a live attempt once — stopping it only when its
role says so."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import jsonschema
import pytest

from corral.domain.agents import AgentEvent, Checkpoint, ToolCallTrace
from corral.domain.governance import IncidentType
from corral.domain.models import Baseline
from corral.domain.states import JobState
from corral.runtime.reporter import Reporter
from corral.runtime.worldwatch import WorldWatch
from corral.schemas import views
from corral.store.memory import MemoryStore
from corral.world import anomaly
from tests.contract.test_store_contract import AGING, NOW, claim, ending, make_job
from tests.unit.test_api_jobs import config
from tests.unit.test_api_world import WORLD

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "schemas"


def baseline(*samples: float, metric: str = "tool_calls") -> Baseline:
    return Baseline(role="r", kind="k", metric=metric, samples=samples, updated_at=NOW)


@pytest.mark.parametrize(
    ("samples", "value", "factor", "flagged"),
    [
        pytest.param((3, 3, 3, 3), 400, 10, False, id="four samples: too few"),
        pytest.param((3, 3, 3, 3, 3), 30, 10, False, id="exactly 10x: not past"),
        pytest.param((3, 3, 3, 3, 3), 31, 10, True, id="past 10x"),
        pytest.param((3, 3, 3, 3, 300), 31, 10, True, id="the median, not the mean"),
        pytest.param((0, 0, 0, 0, 0), 5, 10, False, id="a median of 0"),
        pytest.param((3, 3, 3, 3, 3), 16, 5, True, id="a role's own factor"),
    ],
)
def test_check(samples: tuple[float, ...], value: float, factor: float, flagged: bool) -> None:
    found = anomaly.check("j", 1, {"tool_calls": value}, {"tool_calls": baseline(*samples)}, factor)
    assert bool(found) is flagged
    if flagged:
        (f,) = found
        assert (f.metric, f.value, f.median, f.samples) == ("tool_calls", value, 3, len(samples))
        assert "tool_calls" in f.describe()


def test_a_metric_without_a_baseline_says_nothing() -> None:
    assert anomaly.check("j", 1, {"duration_s": 1e9}, {"tool_calls": baseline(1, 1, 1, 1, 1)}) == []


def test_pushed_keeps_the_latest_window() -> None:
    assert anomaly.pushed((1.0, 2.0), (3.0, 4.0), window=3) == (2.0, 3.0, 4.0)


def _event(job_id: str, calls: int, **kw: object) -> AgentEvent:
    return AgentEvent(
        event_id=f"e-{job_id}",
        job_id=job_id,
        attempt=1,
        at=NOW + 2,
        role="planner",
        worker="process",
        tenant="acme",
        tool_calls=tuple(ToolCallTrace(tool="Bash") for _ in range(calls)),
        tokens_in=100,
        tokens_out=20,
        duration_ms=4000,
        **kw,  # type: ignore[arg-type]
    )


async def _finished(store: MemoryStore, calls: int, **kw: object) -> str:
    job = (await store.submit(make_job(role="planner"), now=NOW, aging_s=AGING)).job
    [won] = await store.start_attempts([claim(job)], now=NOW)
    await store.finish([ending(won.attempt, JobState.SUCCEEDED)], now=NOW + 2)
    await store.record_agent_event(_event(job.id, calls, **kw))
    return job.id


def test_the_reporter_learns_each_clean_attempt() -> None:
    async def main() -> None:
        store = MemoryStore()
        reporter = Reporter(store, baselines=store, clock=lambda: NOW + 3)
        await reporter.write(await _finished(store, 3))
        await reporter.write(await _finished(store, 99, limit_hit="max_tool_calls"))  # not usual
        found = {b.metric: b.samples for b in await store.baselines()}
        assert found == {"tool_calls": (3.0,), "tokens": (120.0,), "duration_s": (4.0,)}
        assert {(b.role, b.kind) for b in await store.baselines()} == {("planner", "process")}
        schema = json.loads((SCHEMAS / "Baseline.json").read_text())
        for b in await store.baselines():  # what `corral world baselines --json` prints
            jsonschema.validate(views.Baseline.of(b).dump(), schema)

    anyio.run(main)


async def _running_with_calls(store: MemoryStore, calls: int) -> str:
    job = (await store.submit(make_job(role="planner"), now=NOW, aging_s=AGING)).job
    await store.start_attempts([claim(job)], now=NOW)
    await store.append_checkpoint(
        Checkpoint(
            job_id=job.id,
            attempt=1,
            at=NOW + 1,
            worker="process",
            session_id=None,
            tool_call_count=calls,
            last_tool="Bash",
            last_output_digest=None,
        )
    )
    return job.id


@pytest.mark.parametrize("stop", [False, True])
def test_a_live_attempt_past_its_baseline_is_flagged_once(tmp_path: Path, stop: bool) -> None:
    text = WORLD.replace(
        "{concurrency: 1}", "{concurrency: 4, anomaly: {stop: " + str(stop).lower() + "}}"
    )
    settings = config(tmp_path, text).settings
    assert settings.roles["planner"].anomaly.stop is stop

    async def main() -> None:
        store = MemoryStore()
        await store.add_baseline_samples(
            [("planner", "process", "tool_calls", 3.0)] * 5, now=NOW, window=50
        )
        usual = await _running_with_calls(store, 12)  # 4× the median: usual enough
        odd = await _running_with_calls(store, 40)
        stopped: list[str] = []

        async def stop_(job_id: str) -> None:
            stopped.append(job_id)

        watch = WorldWatch(store, settings, clock=lambda: NOW + 5, stop=stop_)
        (incident,) = await watch.look()
        assert (incident.type, incident.job_id) == (IncidentType.ANOMALY, odd)
        (finding,) = incident.context["findings"]
        assert (finding["metric"], finding["value"], finding["median"]) == ("tool_calls", 40, 3)
        assert incident.context["stopped"] is stop
        assert stopped == ([odd] if stop else [])
        assert await watch.look() == []  # once
        assert await WorldWatch(store, settings, stop=stop_).look() == []  # after a restart too
        assert usual not in {i.job_id for i in await store.incidents(None, limit=10)}

    anyio.run(main)
