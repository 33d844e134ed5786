"""Corral's MCP tools through the real `mcp` client, connected in memory to the server over the
in-memory store: every tool's structured result, a tenant's view (another tenant's job is not
found), scopes (a reader cannot submit, and the error names the scope), backpressure as an
error result with its retry delay, idempotency keys, the trace summary's figures, and clear
error results where a traceback could have leaked."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from corral.config import Config, load
from corral.domain.agents import AgentEvent, PolicyEvaluation, ToolCallTrace
from corral.domain.errors import NotPermitted
from corral.domain.governance import KillSwitch, ScopeKind
from corral.mcp import Caller, build_server, fixed
from corral.mcp.stdio import caller_for
from corral.services import tokens
from corral.store.memory import MemoryStore

CONFIG = """\
scheduler: {max_queued: 3, backpressure_retry_after_s: 7}
environments:
  local: {max_inflight: 2}
  gpu: {max_inflight: 1, max_queued: 5}
"""
WRITER = Caller("acme", ("jobs:read", "jobs:write"), "test:writer")
READER = Caller("acme", ("jobs:read",), "test:reader")
OTHER = Caller("globex", ("jobs:read", "jobs:write"), "test:other")

Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


def config(tmp_path: Path) -> Config:
    (tmp_path / "corral.yaml").write_text(CONFIG)
    return load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")


def run(cfg: Config, body: Callable[[MemoryStore, dict[str, Call]], Awaitable[None]]) -> None:
    """`body` with one client per caller (writer, reader, other), all over one store."""

    async def main() -> None:
        store = MemoryStore()
        await store.open()
        callers = {"writer": WRITER, "reader": READER, "other": OTHER}
        clients = {
            who: Client(build_server(store, cfg, lambda op: None, fixed(c)))
            for who, c in callers.items()
        }
        async with clients["writer"] as w, clients["reader"] as r, clients["other"] as o:
            calls: dict[str, Call] = {
                "writer": w.call_tool,
                "reader": r.call_tool,
                "other": o.call_tool,
            }
            await body(store, calls)

    anyio.run(main)


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


def failed(result: Any, code: str) -> dict[str, Any]:
    assert result.is_error, result.structured_content
    data: dict[str, Any] = result.structured_content
    assert data["error"] == code, data
    assert "Traceback" not in result.content[0].text
    return data


def test_every_tool_is_listed_with_an_output_schema(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        await store.open()
        async with Client(
            build_server(store, config(tmp_path), lambda op: None, fixed(READER))
        ) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
        assert set(tools) == {
            "job_status",
            "list_jobs",
            "job_trace_summary",
            "cluster_state",
            "queue_depth",
            "submit_job",
            "world_model",
        }
        assert all(t.output_schema for t in tools.values())
        assert all(t.description for t in tools.values())
        assert tools["job_status"].annotations and tools["job_status"].annotations.read_only_hint
        assert tools["submit_job"].input_schema["properties"]["priority"]["maximum"] == 4

    anyio.run(main)


def test_submit_then_read_every_tool_for_the_callers_tenant(tmp_path: Path) -> None:
    async def body(store: MemoryStore, call: dict[str, Call]) -> None:
        made = ok(
            await call["writer"]("submit_job", {"command": ["true"], "idempotency_key": "k1"})
        )
        assert made["created"] and made["job"]["tenant"] == "acme"
        job = made["job"]["id"]
        again = ok(
            await call["writer"]("submit_job", {"command": ["true"], "idempotency_key": "k1"})
        )
        assert not again["created"] and again["job"]["id"] == job  # the key coalesced it
        gpu = ok(await call["writer"]("submit_job", {"command": ["true"], "environment": "gpu"}))
        theirs = ok(await call["other"]("submit_job", {"command": ["true"], "priority": 0}))

        status = ok(await call["reader"]("job_status", {"job_id": job}))
        assert status["id"] == job and status["state"] == "QUEUED" and status["key"] == "k1"
        page = ok(await call["reader"]("list_jobs", {"limit": 1}))
        assert [j["id"] for j in page["jobs"]] == [gpu["job"]["id"]] and page["next_cursor"]
        rest = ok(await call["reader"]("list_jobs", {"cursor": page["next_cursor"]}))
        assert [j["id"] for j in rest["jobs"]] == [job] and rest["next_cursor"] is None
        assert ok(await call["reader"]("list_jobs", {"state": "running"}))["jobs"] == []

        cluster = ok(await call["reader"]("cluster_state", {}))
        envs = {e["name"]: e for e in cluster["environments"]}
        assert envs["gpu"] == {
            "name": "gpu",
            "kind": "local",
            "max_inflight": 1,
            "max_queued": 5,
            "in_flight": 0,
            "queued": 1,
            "tenant_in_flight": 0,
            "tenant_queued": 1,
        }
        assert envs["local"]["queued"] == 2 and envs["local"]["tenant_queued"] == 1
        assert cluster["max_queued"] == 3 and cluster["queued"] == 3
        assert cluster["tenant"] == "acme" and cluster["engine_serving"] is False

        depth = ok(await call["reader"]("queue_depth", {"job_id": job}))
        assert depth["queued"] == 3 and depth["tenant_queued"] == 2
        assert depth["by_environment"] == {"gpu": 1, "local": 2}
        assert depth["by_priority"] == {"0": 1, "2": 2}
        assert depth["placement"]["job"] == job
        assert depth["placement"]["queue_position"] == 1  # the critical job of globex first

        seen = ok(await call["reader"]("world_model", {}))
        assert set(seen["user_plane"]) == {"gpu", "local"} and theirs["job"]["id"] not in str(seen)
        # acme's queued jobs only: one on gpu, one on local (globex's critical job not counted)
        assert {n: e["queue_depth"] for n, e in seen["user_plane"].items()} == {
            "gpu": 1,
            "local": 1,
        }

        # another tenant's job is not found, through every tool that names one
        for tool in ("job_status", "job_trace_summary", "queue_depth"):
            gone = failed(await call["reader"](tool, {"job_id": theirs["job"]["id"]}), "not_found")
            assert theirs["job"]["id"] in gone["message"]
        assert theirs["job"]["id"] not in str(ok(await call["reader"]("list_jobs", {})))

    run(config(tmp_path), body)


def test_a_reader_cannot_submit_and_a_full_queue_says_when_to_retry(tmp_path: Path) -> None:
    async def body(store: MemoryStore, call: dict[str, Call]) -> None:
        refused = failed(await call["reader"]("submit_job", {"command": ["true"]}), "not_permitted")
        assert refused["needed_scope"] == "jobs:write"
        assert "jobs:write" in refused["message"]
        assert ok(await call["writer"]("list_jobs", {}))["jobs"] == []  # nothing was queued
        for _ in range(3):
            ok(await call["writer"]("submit_job", {"command": ["true"]}))
        full = failed(await call["writer"]("submit_job", {"command": ["true"]}), "backpressure")
        assert full["retry_after_s"] == 7 and "retry after 7 s" in full["message"]

    run(config(tmp_path), body)


def test_bad_input_is_a_clear_error_result(tmp_path: Path) -> None:
    async def body(store: MemoryStore, call: dict[str, Call]) -> None:
        bad = failed(await call["reader"]("list_jobs", {"state": "napping"}), "invalid_request")
        assert "QUEUED" in bad["message"]
        failed(
            await call["writer"]("submit_job", {"role": "nobody", "command": ["x"]}),
            "invalid_request",
        )
        failed(await call["writer"]("submit_job", {}), "invalid_request")  # no command, no prompt
        failed(await call["reader"]("job_status", {"job_id": "0"}), "not_found")
        r = await call["writer"]("submit_job", {"command": ["true"], "priority": 9})
        assert r.is_error and "priority" in r.content[0].text  # checked against the schema

    run(config(tmp_path), body)


def test_an_unexpected_failure_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    async def body(store: MemoryStore, call: dict[str, Call]) -> None:
        async def broken(*_: Any, **__: Any) -> Any:
            raise RuntimeError("secret internals")

        store.list_jobs = broken  # type: ignore[method-assign]
        r = failed(await call["reader"]("list_jobs", {}), "error")
        assert r["message"].startswith("internal error (RuntimeError)")
        assert "secret internals" not in r["message"]

    run(config(tmp_path), body)


def test_the_trace_summary_counts_calls_denials_and_tokens(tmp_path: Path) -> None:
    async def body(store: MemoryStore, call: dict[str, Call]) -> None:
        job = ok(await call["writer"]("submit_job", {"command": ["true"]}))["job"]["id"]
        await store.record_agent_event(
            AgentEvent(
                event_id="e1",
                job_id=job,
                attempt=1,
                at=1.0,
                role="default",
                worker="claude-code",
                tenant="acme",
                tool_calls=(
                    ToolCallTrace(tool="Read"),
                    ToolCallTrace(tool="Bash", denied=True, reason="out_of_scope"),
                    ToolCallTrace(tool="Read"),
                ),
                tokens_in=120,
                tokens_out=30,
                cost_usd=0.25,
            )
        )
        decided = [
            ("Read", "allow", "allowed", 1),
            ("Bash", "deny", "out_of_scope", 1),
            ("Read", "allow", "allowed", 1),
            ("mcp__corral__submit_job", "deny", "no_agent_submissions", 2),  # still running
        ]
        await store.append_policy_evaluations(
            [
                PolicyEvaluation(
                    at=2.0,
                    job_id=job,
                    attempt=attempt,
                    stage="tool_call",
                    subject=tool,
                    verdict=verdict,  # type: ignore[arg-type]
                    reason=reason,
                    message=f"{tool}: {reason}",
                )
                for tool, verdict, reason, attempt in decided
            ]
        )
        s = ok(await call["reader"]("job_trace_summary", {"job_id": job}))
        assert (s["tool_calls"], s["denied"], s["tokens_in"], s["tokens_out"]) == (4, 2, 120, 30)
        assert s["cost_usd"] == 0.25
        assert s["verdicts"] == {"allow": 3, "deny": 2}  # the pre-run decision included
        assert s["tools"] == [
            {"tool": "Bash", "calls": 1, "denied": 1},
            {"tool": "Read", "calls": 2, "denied": 0},
            {"tool": "mcp__corral__submit_job", "calls": 1, "denied": 1},
        ]
        assert [(d["tool"], d["reason"]) for d in s["denials"]] == [
            ("Bash", "out_of_scope"),
            ("mcp__corral__submit_job", "no_agent_submissions"),
        ]

    run(config(tmp_path), body)


def test_submissions_inside_a_job_are_its_children(tmp_path: Path) -> None:
    """Through `corral mcp` started inside a job (CORRAL_JOB_ID), a submission is that job's
    child, bounded by the role's recursion depth like any nested submission."""
    (tmp_path / "corral.yaml").write_text("roles: {default: {max_recursion_depth: 1}}\n")
    cfg = load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")

    async def submit_inside(store: MemoryStore, parent: str | None) -> Any:
        inside = Caller("acme", WRITER.scopes, "test", parent_job=parent)
        async with Client(build_server(store, cfg, lambda op: None, fixed(inside))) as c:
            return await c.call_tool("submit_job", {"command": ["true"]})

    async def main() -> None:
        store = MemoryStore()
        await store.open()
        top = ok(await submit_inside(store, None))["job"]
        child = ok(await submit_inside(store, top["id"]))["job"]
        assert (child["parent_id"], child["depth"]) == (top["id"], 1)
        deeper = failed(await submit_inside(store, child["id"]), "invalid_request")
        assert "recursion depth 2 exceeds max_recursion_depth 1" in deeper["message"]

    anyio.run(main)


def test_submit_job_goes_through_the_pre_run_policy(tmp_path: Path) -> None:
    """A kill switch on the tenant denies the job before it is queued; a role that needs a
    human's approval holds it — exactly as `corral submit` would."""
    (tmp_path / "corral.yaml").write_text("roles: {gated: {requires_approval: true}}\n")
    cfg = load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")

    async def main() -> None:
        store = MemoryStore()
        await store.open()
        async with Client(build_server(store, cfg, lambda op: None, fixed(WRITER))) as c:
            held = ok(await c.call_tool("submit_job", {"command": ["true"], "role": "gated"}))
            assert held["job"]["state"] == "AWAITING_APPROVAL"
            await store.activate_kill_switch(
                KillSwitch(
                    id="k1",
                    scope=ScopeKind.TENANT,
                    target="acme",
                    reason="incident 7",
                    created_at=time.time() - 1,
                    created_by="test",
                )
            )
            denied = ok(await c.call_tool("submit_job", {"command": ["true"]}))["job"]
            assert denied["state"] == "DENIED" and "kill" in denied["last_error"]
            summary = ok(await c.call_tool("job_trace_summary", {"job_id": denied["id"]}))
            assert summary["verdicts"] == {"deny": 1}

    anyio.run(main)


def test_a_token_revoked_while_the_stdio_server_runs_is_refused_at_the_next_call(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path)

    async def main() -> None:
        store = MemoryStore()
        await store.open()
        made = await tokens.create(store, tenant="acme", scopes="jobs:read,jobs:write", by="t")
        who = await caller_for(store, made.text, read_only=True, parent_job=None)
        async with Client(build_server(store, cfg, lambda op: None, who)) as c:
            ok(await c.call_tool("list_jobs", {}))
            reading = failed(
                await c.call_tool("submit_job", {"command": ["true"]}), "not_permitted"
            )
            assert reading["needed_scope"] == "jobs:write"  # --read-only trims the token's scopes
            await tokens.revoke(store, made.token.id, by="t")
            gone = failed(await c.call_tool("list_jobs", {}), "not_permitted")
            assert "revoked" in gone["message"]
        with pytest.raises(NotPermitted, match="invalid, expired or revoked"):
            await caller_for(store, made.text, read_only=False, parent_job=None)

    anyio.run(main)
