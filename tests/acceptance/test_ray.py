"""Ray environments against a real Ray head on loopback: the admission cap (no job waits
PENDING inside Ray), a cancel that leaves no process, an engine SIGKILL mid-job (adopted, not
run twice, its log complete to the last line), the core and its Ray watcher killed mid-job (the
same), notebooks on Ray copied back on success and on
failure, and a secret that never reaches Ray's job API, Ray's logs, the store or the traces.

One head serves the whole module (it takes ≈ 17 s to start); it runs in its own process group
and is stopped by killing that group."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from corral.runtime.control import poke
from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.acceptance.notebooks import NOTEBOOK_BAD, NOTEBOOK_OK, write_notebook
from tests.acceptance.rayhead import Head, free_port, running_head
from tests.helpers import eventually

pytest.importorskip("ray.job_submission", reason="the ray extra is part of the dev set-up")

CIRCUIT = "CIRCUIT_OPEN"


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    with running_head() as h:
        yield h


class AuthProxy:
    """A loopback proxy in front of the head's job server that, like Ray's own token auth,
    refuses every call without `Authorization: Bearer <token>` (401) and forwards the others.
    It can be stopped and started again on the same port: a cluster that goes away and comes
    back."""

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream, self.token = upstream, token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.passed = self.refused = 0
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {proxy.token}":
                    proxy.refused += 1
                    self._reply(401, b"Unauthorized: Missing authentication token")
                    return
                proxy.passed += 1
                size = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(size) if size else None
                req = urllib.request.Request(
                    proxy.upstream + self.path,
                    data=data,
                    method=self.command,
                    headers={"Content-Type": "application/json"} if data else {},
                )
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        self._reply(r.status, r.read())
                except urllib.error.HTTPError as err:
                    self._reply(err.code, err.read())

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def proxy(head: Head) -> Iterator[AuthProxy]:
    p = AuthProxy(head.address, "tok-" + os.urandom(12).hex())
    p.start()
    try:
        yield p
    finally:
        p.stop()


def _config(head: Head, *, max_queued: int | None = None) -> str:
    queued = f"\n    max_queued: {max_queued}" if max_queued else ""
    return f"""\
scheduler:
  poll_interval_s: 0.2
core:
  heartbeat_timeout_s: 30  # a loaded machine must not crash-loop the core (tests share 2 cores)
roles:
  default:
    concurrency: 16
    retry: {{base_s: 0.05, cap_s: 0.2}}
environments:
  local:
    max_inflight: 8
  gpu:
    kind: ray
    address: {head.address}
    max_inflight: 4
    num_cpus: 1
    runtime_env: {{env_vars: {{PLAIN_SETTING: visible}}}}{queued}
"""


@pytest.fixture
def ray_corral(tmp_path: Path, head: Head) -> Iterator[Corral]:
    c = Corral(tmp_path, _config(head, max_queued=2))
    try:
        yield c
    finally:
        c.stop_all()


def _state(c: Corral, job: str) -> str:
    return str(c.job(job)["state"])


def test_a_flood_of_six_keeps_four_in_ray_and_two_queued_in_corral(
    ray_corral: Corral, head: Head
) -> None:
    c = ray_corral
    c.serve()
    # each job runs until the test lets it end: the snapshot below does not race the jobs
    script = ("sh", "-c", "echo start; while [ ! -e release ]; do sleep 0.2; done; echo done")
    jobs = [c.submit(*script, opts=("--env", "gpu")) for _ in range(4)]
    eventually(
        lambda: all(_state(c, j) != "QUEUED" for j in jobs), timeout=30, what="four dispatched"
    )
    jobs += [c.submit(*script, opts=("--env", "gpu")) for _ in range(2)]

    def ours() -> list[Any]:
        prefixes = tuple(f"corral-{j}-" for j in jobs)
        return [
            r for r in head.client().list_jobs() if (r.submission_id or "").startswith(prefixes)
        ]

    eventually(
        lambda: [r.status.value for r in ours()].count("RUNNING") == 4,
        timeout=90,
        what="four Ray jobs running",
    )
    in_ray = ours()
    assert len(in_ray) == 4, [(r.submission_id, r.status) for r in in_ray]  # none PENDING
    health = c.json("status")["clusters"]
    assert [(h["env"], h["reachable"], h["nodes_alive"], h["cpus_total"]) for h in health] == [
        ("gpu", True, 1, 8.0)
    ]
    assert health[0]["corral_jobs"] == {"RUNNING": 4}
    assert 'corral_ray_jobs{env="gpu",status="running"} 4.0' in c.ok("metrics")
    assert sorted(_state(c, j) for j in jobs).count("QUEUED") == 2, [_state(c, j) for j in jobs]
    # past the environment's own queue bound a submission is refused (the API's 429)
    refused = c.run("submit", "--env", "gpu", "--", "true")
    assert refused.returncode != 0 and "gpu" in refused.stderr, refused.stderr
    (c.work / "release").touch()
    for j in jobs:
        assert c.wait(j, timeout=90) == 0, c.engine_log()
    for j in jobs:  # one Ray job per Corral job: each ran exactly once
        assert [r.submission_id for r in head.jobs(j)] == [f"corral-{j}-1"]
        # Ray's job supervisor writes its "Running entrypoint" line through a buffered file it
        # flushes only after starting the job (ray 2.60 job_supervisor.py): on a loaded machine
        # the job's first line comes before it (seen in CI). Each line once, in the job's order.
        lines = [x for x in c.ok("logs", j).splitlines() if not x.startswith("Running entry")]
        assert lines[-2:] == ["start", "done"], c.ok("logs", j)


def test_cancel_of_a_running_ray_job_leaves_no_process(ray_corral: Corral, head: Head) -> None:
    c = ray_corral
    job = c.submit(
        "sh", "-c", "sleep 300 & echo $! > child; echo $$ > pid; wait", opts=("--env", "gpu")
    )
    c.serve()
    pid_file, child_file = c.work / "pid", c.work / "child"
    eventually(lambda: pid_file.exists() and child_file.exists(), timeout=60, what="the job")
    pids = [int(pid_file.read_text()), int(child_file.read_text())]
    assert all(alive(p) for p in pids)
    c.ok("cancel", job)
    assert c.wait(job, timeout=60) == 130
    assert [j.status.value for j in head.jobs(job)] == ["STOPPED"]
    eventually(lambda: not any(alive(p) for p in pids), timeout=20, what="the processes gone")
    assert c.job(job)["state"] == "CANCELLED"


def test_a_ray_job_past_its_timeout_is_stopped_in_ray(ray_corral: Corral, head: Head) -> None:
    c = ray_corral
    job = c.submit(
        "sh", "-c", "echo $$ > pid; exec sleep 300", opts=("--env", "gpu", "--timeout", "25")
    )
    c.serve()
    eventually(lambda: (c.work / "pid").exists(), timeout=60, what="the Ray job running")
    pid = int((c.work / "pid").read_text())
    assert c.wait(job, timeout=90) == 124  # TIMED_OUT
    assert [j.status.value for j in head.jobs(job)] == ["STOPPED"]
    eventually(lambda: not alive(pid), timeout=20, what="the job's process gone")
    shown = c.job(job)
    assert shown["limit_hit"] == "max_duration_s", shown


def test_engine_sigkill_mid_job_adopts_the_ray_job_and_keeps_its_whole_log(
    ray_corral: Corral, head: Head
) -> None:
    c = ray_corral
    script = (
        "echo run >> runs.txt; for i in $(seq 1 60); do echo line $i; sleep 0.1; done; "
        "echo last-line"
    )
    job = c.submit("sh", "-c", script, opts=("--env", "gpu"))
    engine = c.serve()
    eventually(lambda: (c.work / "runs.txt").exists(), timeout=60, what="the Ray job running")
    engine.send_signal(signal.SIGKILL)
    engine.wait()
    # the control plane is down; the Ray job goes on
    assert [j.status.value for j in head.jobs(job)] == ["RUNNING"]
    sid = f"corral-{job}-1"
    before = head.client().get_job_logs(sid).count("line ")
    eventually(  # lines written while no engine watched
        lambda: head.client().get_job_logs(sid).count("line ") >= before + 5,
        timeout=30,
        what="the Ray job writing on with the engine down",
    )
    c.serve()
    assert c.wait(job, timeout=90) == 0, c.engine_log()
    assert (c.work / "runs.txt").read_text() == "run\n"  # not run twice
    assert [j.submission_id for j in head.jobs(job)] == [f"corral-{job}-1"]
    lines = [ln for ln in c.ok("logs", job).splitlines() if ln.startswith(("line", "last"))]
    assert lines == [f"line {i}" for i in range(1, 61)] + ["last-line"]
    timeline = [e["kind"] for e in c.job(job)["timeline"]]
    assert timeline.count("running") == 1, timeline


def test_a_killed_watcher_is_an_outage_the_engine_rides_out(ray_corral: Corral, head: Head) -> None:
    """The watcher is the core's: SIGKILL the core mid-job and its supervisor starts another,
    which adopts the Ray job by its submission id and follows it from its log offset."""
    c = ray_corral
    script = (
        "echo run >> runs.txt; for i in $(seq 1 40); do echo line $i; sleep 0.1; done; "
        "echo last-line"
    )
    job = c.submit("sh", "-c", script, opts=("--env", "gpu"))
    c.serve()
    eventually(lambda: (c.work / "runs.txt").exists(), timeout=60, what="the Ray job running")
    running = [e for e in c.job(job)["timeline"] if e["kind"] == "running"]
    assert f"ray:corral-{job}-1" in str(running), running  # no local process: a Ray job
    first = eventually(lambda: poke(c.data, "ping") or None, what="the engine")
    os.kill(first["core_pid"], signal.SIGKILL)
    assert c.wait(job, timeout=90) == 0, c.engine_log()
    after = poke(c.data, "ping") or {}
    assert after["core_restarts"] == 1 and after["core_pid"] != first["core_pid"]
    assert (c.work / "runs.txt").read_text() == "run\n"  # not run twice
    assert [j.submission_id for j in head.jobs(job)] == [f"corral-{job}-1"]
    lines = [ln for ln in c.ok("logs", job).splitlines() if ln.startswith(("line", "last"))]
    assert lines == [f"line {i}" for i in range(1, 41)] + ["last-line"]


def test_notebooks_on_ray_are_copied_back_on_success_and_on_failure(
    ray_corral: Corral, head: Head
) -> None:
    c = ray_corral
    write_notebook(c.work / "ok.ipynb", NOTEBOOK_OK)
    write_notebook(c.work / "bad.ipynb", NOTEBOOK_BAD)
    opts = ("--env", "gpu", "--copyback", "out", "--max-attempts", "1")
    ok = c.ok("submit", "--notebook", "ok.ipynb", "-P", "x=21", *opts).strip()
    bad = c.ok("submit", "--notebook", "bad.ipynb", *opts).strip()
    c.serve()
    assert c.wait(ok, timeout=120) == 0, c.ok("logs", ok)
    assert c.wait(bad, timeout=120) != 0
    assert [j.status.value for j in head.jobs(ok)] == ["SUCCEEDED"]
    for name in ("ok.ipynb", "bad.ipynb"):
        copy = c.work / "out" / name
        record = json.loads((c.work / "out" / f"{name}.json").read_text())
        assert record["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    executed = json.loads((c.work / "out" / "ok.ipynb").read_text())
    assert executed["metadata"]["papermill"]["parameters"] == {"x": 21}
    assert "result 42" in json.dumps(executed)
    shown = c.job(bad)
    assert shown["last_error"].startswith("notebook cell 2 failed: ValueError: bad x 1")
    assert c.job(ok)["notebook"]["parameters"] == {"x": 21}


def test_a_secret_never_reaches_ray_the_store_or_the_traces(ray_corral: Corral, head: Head) -> None:
    c = ray_corral
    canary = "canary-" + os.urandom(8).hex()
    digest = hashlib.sha256(canary.encode()).hexdigest()
    job = c.submit(
        "sh",
        "-c",
        'printf %s "$CANARY" | sha256sum; echo "plain=$PLAIN_SETTING"',
        opts=("--env", "gpu", "--setenv", f"CANARY={canary}", "--secret-env", "CANARY"),
    )
    c.drain(timeout=120)
    assert _state(c, job) == "SUCCEEDED", c.engine_log()
    logs = c.ok("logs", job)
    assert digest in logs  # the job had the secret
    assert "plain=visible" in logs  # and the environment's runtime env
    sid = f"corral-{job}-1"
    assert canary not in head.raw(sid)  # Ray's job API (entrypoint, runtime_env, metadata)
    assert canary not in head.client().get_job_logs(sid)
    attempt_dirs = list((c.data / "attempts").glob(f"{job}.*"))
    assert attempt_dirs and not (attempt_dirs[0] / "ray-env.json").exists()
    for path in c.data.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
    for cmd in (("trace", job, "--json"), ("show", job, "--json"), ("events", "--json")):
        assert canary not in c.run(*cmd).stdout


def test_an_unreachable_cluster_is_the_environments_failure_not_the_jobs(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = f"""\
scheduler:
  poll_interval_s: 0.2
core:
  heartbeat_timeout_s: 30  # a loaded machine must not crash-loop the core (tests share 2 cores)
roles:
  default:
    retry: {{base_s: 0.05, cap_s: 0.2}}
breakers: {{consecutive_failures: 2, min_calls: 2}}
environments:
  local:
    max_inflight: 4
  gpu:
    kind: ray
    address: {dead}
"""
    c = Corral(tmp_path, config)
    try:
        job = c.submit("true", opts=("--env", "gpu", "--max-attempts", "2"))
        local = c.submit("true")
        c.serve()
        assert c.wait(local, timeout=30) == 0  # a local job is not held by the cluster's breaker

        def breakers() -> dict[str, Any]:
            return {b["name"]: b for b in c.json("breakers")}

        eventually(
            lambda: breakers().get("env:gpu", {}).get("state") == "OPEN",
            timeout=30,
            what="the environment's breaker open",
        )
        assert breakers().get("worker:command", {}).get("state", "CLOSED") == "CLOSED"
        status = c.json("status")
        assert status["clusters"][0]["reachable"] is False
        assert status["watchdog"]["clusters"]["gpu"]["reachable"] is False
        assert 'corral_ray_up{env="gpu"} 0.0' in c.ok("metrics")
        # the job waits for the cluster instead of spending its attempts on it; one that was
        # dispatched before the first probe came back failed as the cluster's fault, not its own
        shown = c.job(job)
        assert shown["state"] in ("QUEUED", "RETRY_WAIT"), shown
        ended = [e for e in shown["timeline"] if e["kind"] == "attempt_ended"]
        assert len(ended) <= 1 and all(e["data"]["fault"] == "worker" for e in ended), ended
    finally:
        c.stop_all()


def test_the_token_goes_with_every_call_and_nowhere_else(tmp_path: Path, proxy: AuthProxy) -> None:
    token_file = tmp_path / "ray-token"
    token_file.write_text(proxy.token + "\n")
    config = f"""\
scheduler:
  poll_interval_s: 0.2
core:
  heartbeat_timeout_s: 30  # a loaded machine must not crash-loop the core (tests share 2 cores)
environments:
  local:
    max_inflight: 4
  secure:
    kind: ray
    address: {proxy.url}
    auth: {{token_file: {token_file}}}
    health_interval_s: 0.5
  bare:
    kind: ray
    address: {proxy.url}
"""
    c = Corral(tmp_path, config)
    try:
        job = c.submit("sh", "-c", "echo ran-behind-auth", opts=("--env", "secure"))
        refused = c.submit("true", opts=("--env", "bare", "--max-attempts", "1"))
        c.serve()
        assert c.wait(job, timeout=90) == 0, c.engine_log()
        assert "ran-behind-auth" in c.ok("logs", job)
        assert c.wait(refused, timeout=60) != 0  # no token: the job server refuses it
        assert "401" in c.job(refused)["last_error"]
        health = {h["env"]: h for h in c.json("status")["clusters"]}
        assert health["secure"]["reachable"] is True, health
        assert health["bare"]["reachable"] is False and "401" in health["bare"]["error"]
        assert proxy.passed > 0
        before = proxy.refused
        status = c.json("status")
        assert proxy.refused > before  # `bare` asked again without a token: refused again
        assert status["watchdog"]["clusters"]["secure"]["reachable"] is True
        outputs = [
            c.run(*cmd).stdout
            for cmd in (
                ("show", job, "--json"),
                ("show", refused, "--json"),
                ("trace", job, "--json"),
                ("events", "--json"),
                ("status", "--json"),
                ("breakers", "--json"),
                ("metrics",),
            )
        ]
        assert all(proxy.token not in out for out in outputs)
        for path in c.data.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # SQLite's -wal may go meanwhile
                if path.is_file():
                    assert proxy.token.encode() not in path.read_bytes(), path
        sid = f"corral-{job}-1"
        req = urllib.request.Request(
            f"{proxy.url}/api/jobs/{sid}", headers={"Authorization": f"Bearer {proxy.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert proxy.token not in r.read().decode()  # not in Ray's job info either
    finally:
        c.stop_all()


def test_an_unreachable_cluster_holds_its_jobs_in_the_queue_until_it_is_back(
    tmp_path: Path, proxy: AuthProxy
) -> None:
    config = f"""\
scheduler:
  poll_interval_s: 0.2
core:
  heartbeat_timeout_s: 30  # a loaded machine must not crash-loop the core (tests share 2 cores)
environments:
  local:
    max_inflight: 4
  gpu:
    kind: ray
    address: {proxy.url}
    auth: {{token_env: CORRAL_TEST_RAY_TOKEN}}
    health_interval_s: 0.3
"""
    c = Corral(tmp_path, config)
    os.environ["CORRAL_TEST_RAY_TOKEN"] = proxy.token  # the engine's environment (Corral.env)
    try:
        c.serve()

        def breaker() -> dict[str, Any]:
            return {b["name"]: b for b in c.json("breakers")}.get("env:gpu") or {}

        proxy.stop()  # the cluster goes away
        eventually(lambda: breaker().get("state") == "OPEN", timeout=30, what="breaker open")
        assert breaker()["reason"] == "cluster_unreachable"
        seen = c.json("status")["watchdog"]["clusters"]["gpu"]
        assert seen["reachable"] is False and seen["error"], seen
        job = c.submit("sh", "-c", "echo after-outage", opts=("--env", "gpu"))
        local = c.submit("true")
        assert c.wait(local, timeout=30) == 0  # other environments go on

        def refused() -> bool:  # the scheduler asked for its permit and the breaker said no
            return any(
                e["kind"] == "permit_rejected" and e["data"]["reason"] == CIRCUIT
                for e in c.job(job)["timeline"]
            )

        eventually(refused, timeout=30, what="the job's permit refused by the open breaker")
        shown = c.job(job)
        assert shown["state"] == "QUEUED" and shown["attempts"] == [], shown
        proxy.start()  # back, on the same address
        eventually(lambda: breaker().get("state") == "CLOSED", timeout=30, what="breaker closed")
        assert breaker()["history"][-1]["reason"] == "cluster_reachable"
        assert c.wait(job, timeout=90) == 0, c.engine_log()
        assert len(c.job(job)["attempts"]) == 1
        kinds = [
            (e.get("name"), e.get("state")) for e in c.json("events") if e.get("kind") == "defense"
        ]
        assert ("gpu", "unreachable") in kinds and ("gpu", "reachable") in kinds, kinds
    finally:
        os.environ.pop("CORRAL_TEST_RAY_TOKEN", None)
        c.stop_all()
