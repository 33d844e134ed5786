"""The Ray worker's pure parts: the submission id, the log copy by byte offset (resumed without
duplicates), the watcher's command line (no environment value in it), what a helper's note
makes of an attempt's result, the environment's breaker, and notebook parameters."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest

from corral.config_models import parse, resolve
from corral.core.breakers import breaker_names, remote_envs
from corral.domain.errors import ConfigError, InvalidRequest, WorkerMisconfigured
from corral.domain.models import AttemptResult
from corral.domain.settings import EnvSpec, Settings
from corral.domain.states import Fault, Outcome
from corral.services import notebooks
from corral.services.submissions import SubmitRequest
from corral.workers import rayauth, rayhealth, rayjob, raywatch
from corral.workers.command import with_note
from corral.workers.notes import read_note, write_note
from tests.helpers import eventually
from tests.unit.test_retry import job


class JobServer:
    """A job server that speaks the calls of Ray's job API the watcher makes (`/api/jobs/…`),
    over real HTTP on loopback, with jobs the test moves along by hand."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, object]] = {}
        self.logs: dict[str, str] = {}
        self.calls: list[str] = []
        self.fail = False  # answer every call with a 503
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive, as Ray's dashboard keeps it

            def _send(self, code: int, doc: object) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                server.calls.append(f"GET {self.path}")
                sid = self.path.split("/")[3]
                if server.fail:
                    return self._send(503, {})
                if sid not in server.jobs:
                    return self._send(404, {"detail": f"Job {sid} does not exist"})
                if self.path.endswith("/logs"):
                    return self._send(200, {"logs": server.logs.get(sid, "")})
                return self._send(200, server.jobs[sid])

            def do_POST(self) -> None:
                server.calls.append(f"POST {self.path}")
                if server.fail:
                    return self._send(503, {})
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
                if self.path == "/api/jobs/":
                    sid = doc["submission_id"]
                    if sid in server.jobs:
                        return self._send(500, {"detail": f"Job {sid} already exists"})
                    server.jobs[sid] = {"status": "RUNNING", "entrypoint": doc["entrypoint"]}
                    return self._send(200, {"submission_id": sid})
                sid = self.path.split("/")[3]
                server.jobs[sid]["status"] = "STOPPED"
                return self._send(200, {"stopped": True})

            def log_message(self, *_args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def jobserver() -> Iterator[JobServer]:
    server = JobServer()
    yield server
    server.close()


def _spec(tmp_path: Path, **kw: object) -> raywatch.Spec:
    spec = raywatch.Spec(
        sid="corral-j-1",
        attempt_dir=tmp_path,
        command=["sh", "-c", "echo hi"],
        cwd=str(tmp_path),
        env={"API_KEY": "s3cret-value", "CORRAL_JOB_ID": "j"},
        secrets=("s3cret-value",),
    )
    for k, v in kw.items():
        setattr(spec, k, v)
    return spec


def _result(attempt: raywatch.RayAttempt) -> AttemptResult:
    async def wait() -> AttemptResult:
        with anyio.fail_after(20):
            return await attempt.wait()

    return anyio.run(wait)


def test_the_watcher_submits_copies_whole_lines_redacted_and_the_last_line_once_ended(
    tmp_path: Path, jobserver: JobServer
) -> None:
    w = raywatch.RayWatcher("gpu", jobserver.address, poll_s=0.05)
    attempt = w.run(_spec(tmp_path))
    eventually(lambda: "corral-j-1" in jobserver.jobs, what="the job submitted")
    entry = str(jobserver.jobs["corral-j-1"]["entrypoint"])
    assert "s3cret" not in entry and "corral.workers.rayentry" in entry  # no value in Ray
    assert json.loads((tmp_path / rayjob.ENV_FILE).read_text())["API_KEY"] == "s3cret-value"
    assert (tmp_path / rayjob.ENV_FILE).stat().st_mode & 0o777 == 0o600
    jobserver.logs["corral-j-1"] = "line 1\nkey s3cret-value\npart"
    eventually(lambda: (tmp_path / "stdout.log").exists(), what="the first lines copied")
    rounds = w.rounds
    eventually(lambda: w.rounds > rounds + 2, what="more rounds")
    assert (tmp_path / "stdout.log").read_text() == "line 1\nkey [REDACTED]\n"  # whole lines
    jobserver.logs["corral-j-1"] += "ial last"
    jobserver.jobs["corral-j-1"].update(status="SUCCEEDED", driver_exit_code=0)
    result = _result(attempt)
    assert (result.outcome, result.exit_code) == (Outcome.EXITED, 0)
    assert (tmp_path / "stdout.log").read_text() == "line 1\nkey [REDACTED]\npartial last"
    assert int((tmp_path / rayjob.OFFSET_FILE).read_text()) == len(
        jobserver.logs["corral-j-1"].encode()
    )
    # adopted again (a new core): it follows from the offset, never writing a line twice
    again = w.run(_spec(tmp_path, adopted=True))
    assert _result(again).exit_code == 0
    assert (tmp_path / "stdout.log").read_text().count("line 1") == 1
    assert not [c for c in jobserver.calls if c.startswith("POST")][1:]  # submitted once


def test_a_stop_a_deadline_and_an_unknown_job_end_an_attempt_as_they_should(
    tmp_path: Path, jobserver: JobServer
) -> None:
    w = raywatch.RayWatcher("gpu", jobserver.address, poll_s=0.05)
    (tmp_path / "a").mkdir()
    cancelled = w.run(_spec(tmp_path / "a", sid="s-a"))
    eventually(lambda: "s-a" in jobserver.jobs, what="submitted")
    cancelled.stop()
    assert _result(cancelled).outcome is Outcome.CANCELLED
    assert jobserver.jobs["s-a"]["status"] == "STOPPED"
    (tmp_path / "b").mkdir()
    late = w.run(_spec(tmp_path / "b", sid="s-b", deadline_at=1.0))
    eventually(lambda: "s-b" in jobserver.jobs, what="submitted")
    late.check(2.0)
    shown = _result(late)
    assert (shown.outcome, shown.limit_hit) == (Outcome.TIMED_OUT, "max_duration_s")
    idle = raywatch.RayWatcher("gpu", jobserver.address)  # its thread not started: stepped here
    early = raywatch.RayAttempt(idle, _spec(tmp_path, sid="s-early"))
    early.stop()  # cancelled before the watcher's round submitted it: it never reaches Ray
    idle.step(early)
    assert _result(early).outcome is Outcome.CANCELLED and "s-early" not in jobserver.jobs
    (tmp_path / "c").mkdir()
    unknown = _result(w.run(_spec(tmp_path / "c", sid="s-c", adopted=True)))
    assert (unknown.outcome, unknown.fault) == (Outcome.LOST, Fault.WORKER)
    jobserver.jobs["s-dup"] = {"status": "SUCCEEDED", "entrypoint": "first"}
    (tmp_path / "dup").mkdir()  # submitted twice (a broken connection): the job Ray has is it
    assert _result(w.run(_spec(tmp_path / "dup", sid="s-dup"))).exit_code == 0
    assert jobserver.jobs["s-dup"]["entrypoint"] == "first"
    assert "following Ray job s-dup" in (tmp_path / "dup" / "stderr.log").read_text()
    jobserver.jobs["s-d"] = {"status": "FAILED", "driver_exit_code": 3}
    (tmp_path / "d").mkdir()
    failed = _result(w.run(_spec(tmp_path / "d", sid="s-d", adopted=True)))
    assert (failed.exit_code, failed.fault) == (3, Fault.JOB)
    jobserver.jobs["s-e"] = {"status": "FAILED", "error_type": "RUNTIME_ENV_SETUP_FAILED"}
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / rayjob.ENV_FILE).write_text("{}")  # Ray never started its entrypoint
    ray_fault = _result(w.run(_spec(tmp_path / "e", sid="s-e", adopted=True)))
    assert not (tmp_path / "e" / rayjob.ENV_FILE).exists()
    assert (ray_fault.exit_code, ray_fault.fault) == (raywatch.EXIT_RAY, Fault.WORKER)
    assert "RUNTIME_ENV_SETUP_FAILED" in (ray_fault.error or "")


def test_the_output_cap_stops_the_ray_job_and_keeps_the_first_and_last_part(
    tmp_path: Path, jobserver: JobServer
) -> None:
    w = raywatch.RayWatcher("gpu", jobserver.address, poll_s=0.05)
    attempt = w.run(_spec(tmp_path, max_bytes=20, tail_bytes=12))
    eventually(lambda: "corral-j-1" in jobserver.jobs, what="submitted")
    jobserver.logs["corral-j-1"] = "".join(f"line {i:02d}\n" for i in range(10))
    result = _result(attempt)
    assert (result.limit_hit, jobserver.jobs["corral-j-1"]["status"]) == ("output", "STOPPED")
    text = (tmp_path / "stdout.log").read_text()
    assert text.startswith("line 00\nline 01\nline") and text.endswith("line 09\n")
    assert "output cap of 20 bytes reached" in text


def test_an_unreachable_cluster_is_the_workers_fault_and_a_dead_thread_is_started_again(
    tmp_path: Path, jobserver: JobServer
) -> None:
    w = raywatch.RayWatcher("gpu", jobserver.address, poll_s=0.01)
    jobserver.fail = True
    refused = _result(w.run(_spec(tmp_path)))
    assert (refused.exit_code, refused.fault) == (raywatch.EXIT_RAY, Fault.WORKER)
    assert "cannot submit to the Ray cluster" in (refused.error or "")
    assert not (tmp_path / rayjob.ENV_FILE).exists()  # the environment file is not left behind
    thread = w._thread
    assert thread is not None
    w.close()  # its thread ended
    assert not thread.is_alive()
    jobserver.fail = False
    (tmp_path / "b").mkdir()
    attempt = w.run(_spec(tmp_path / "b", sid="s-b"))
    assert w._thread is not thread and w._thread.is_alive()  # started again
    eventually(lambda: "s-b" in jobserver.jobs, what="submitted by the new thread")
    jobserver.jobs["s-b"]["status"] = "SUCCEEDED"
    assert _result(attempt).exit_code == 0


def test_a_submission_id_is_the_same_for_the_same_attempt() -> None:
    assert rayjob.submission_id("j1", 2) == rayjob.submission_id("j1", 2) == "corral-j1-2"
    assert rayjob.submission_id("j1", 3) != rayjob.submission_id("j1", 2)


def test_a_note_gives_a_failed_attempt_its_words_and_whose_fault(tmp_path: Path) -> None:
    failed = AttemptResult(outcome=Outcome.EXITED, exit_code=70, fault=Fault.JOB)
    assert with_note(failed, tmp_path) is failed  # no note: as it was
    write_note(tmp_path, error="cannot submit to the Ray cluster", fault="worker")
    assert read_note(tmp_path) == ("cannot submit to the Ray cluster", "worker")
    noted = with_note(failed, tmp_path)
    assert (noted.error, noted.fault) == ("cannot submit to the Ray cluster", Fault.WORKER)
    ok = AttemptResult(outcome=Outcome.EXITED, exit_code=0)
    assert with_note(ok, tmp_path) is ok  # a success stays one
    stopped = AttemptResult(outcome=Outcome.CANCELLED)
    assert with_note(stopped, tmp_path) is stopped  # a stop on request stays a stop
    late = AttemptResult(outcome=Outcome.TIMED_OUT, error="deadline reached")
    assert with_note(late, tmp_path).error == "deadline reached; cannot submit to the Ray cluster"
    (tmp_path / "worker-note.json").write_text(json.dumps({"error": "x", "fault": "nobody"}))
    assert read_note(tmp_path) is None  # an unknown fault is not believed


def test_an_attempt_on_a_ray_environment_answers_to_the_environments_breaker() -> None:
    settings = Settings(
        roles={},
        environments={
            "local": EnvSpec(name="local"),
            "gpu": EnvSpec(name="gpu", kind="ray", address="http://127.0.0.1:1"),
        },
    )
    remote = remote_envs(settings)
    assert remote == frozenset({"gpu"})
    assert breaker_names(job().with_(env_name="gpu"), "command", remote) == ["env:gpu"]
    assert breaker_names(job().with_(env_name="local"), "command", remote) == ["worker:command"]


def test_notebook_parameters_and_requests() -> None:
    assert notebooks.parse_params(["a=3", "b=true", "c=eu", 'd="x"', "e=[1, 2]"]) == {
        "a": 3,
        "b": True,
        "c": "eu",
        "d": "x",
        "e": [1, 2],
    }
    for bad in ("a", "=3", "1a=2", "a-b=1"):
        with pytest.raises(InvalidRequest):
            notebooks.parse_params([bad])
    base = SubmitRequest(cwd="/work", env_name="gpu")
    req = notebooks.notebook_request(base, "nb.ipynb", params={"a": 3}, copyback="out")
    assert req.notebook == {
        "source": "/work/nb.ipynb",
        "parameters": {"a": 3},
        "kernel": "python3",
        "copyback": "/work/out",
    }
    assert req.command[1:5] == ("-m", "corral.workers.notebook", "--input", "/work/nb.ipynb")
    assert req.command[req.command.index("--param") :][:2] == ("--param", "a=3")
    assert req.worker == "command" and req.env_name == "gpu"
    with pytest.raises(InvalidRequest, match="both"):
        notebooks.notebook_request(
            base, "nb.ipynb", params={}, copyback="o", hook_command="x", hook_url="http://h/"
        )


def test_a_ray_environment_takes_resources_and_a_runtime_env_a_local_one_does_not() -> None:
    text = """\
environments:
  gpu:
    kind: ray
    address: http://127.0.0.1:8265
    num_cpus: 2
    memory: 1000
    runtime_env: {working_dir: /srv/code, env_vars: {LOG_LEVEL: info}}
"""
    env = resolve(parse(text, "corral.yaml"), "corral.yaml").environments["gpu"]
    assert env.resources == {"num_cpus": 2.0, "memory": 1000.0}
    assert env.runtime_env == {"working_dir": "/srv/code", "env_vars": {"LOG_LEVEL": "info"}}
    sent: dict[str, object] = {}

    class Client:
        def submit_job(self, **kwargs: object) -> str:
            sent.update(kwargs)
            return "s"

    rayjob.submit(Client(), "s", "true", env.resources, env.runtime_env)
    assert sent["runtime_env"] == env.runtime_env
    assert (sent["entrypoint_num_cpus"], sent["entrypoint_memory"]) == (2.0, 1000)
    with pytest.raises(ConfigError, match="only a ray environment"):
        resolve(parse("environments:\n  l:\n    runtime_env: {pip: [x]}\n", "c.yaml"), "c.yaml")
    with pytest.raises(ConfigError, match="address"):
        resolve(parse("environments:\n  r:\n    kind: ray\n", "c.yaml"), "c.yaml")


def test_a_ray_environments_token_comes_from_a_file_or_a_variable_never_the_config(
    tmp_path: Path,
) -> None:
    (tmp_path / "tok").write_text("s3cret-token\n")
    text = """\
environments:
  a: {kind: ray, address: "http://h:1", auth: {token_file: tok}}
  b: {kind: ray, address: "http://h:1", auth: {token_env: RAY_TOKEN}}
  c: {kind: ray, address: "http://h:1"}
"""
    source = str(tmp_path / "corral.yaml")
    envs = resolve(parse(text, source), source).environments
    assert envs["a"].auth_token_file == str(tmp_path / "tok")  # relative to the file
    assert rayauth.token(envs["a"]) == "s3cret-token"
    assert rayauth.token(envs["b"], {"RAY_TOKEN": "t2"}) == "t2"
    assert rayauth.token(envs["c"]) is None
    assert rayauth.headers("t2") == {"Authorization": "Bearer t2"} and rayauth.headers(None) == {}
    with pytest.raises(WorkerMisconfigured, match="RAY_TOKEN is not set") as err:
        rayauth.token(envs["b"], {})
    (tmp_path / "tok").unlink()
    with pytest.raises(WorkerMisconfigured, match="cannot read its Ray token file") as err:
        rayauth.token(envs["a"])
    assert "s3cret" not in str(err.value)
    for bad in ("{}", "{token_file: x, token_env: Y}"):
        with pytest.raises(ConfigError, match="exactly one"):
            resolve(parse(text.replace("{token_env: RAY_TOKEN}", bad), source), source)
    with pytest.raises(ConfigError, match="only a ray environment"):
        resolve(parse("environments:\n  l: {auth: {token_env: X}}\n", source), source)


def test_the_watcher_and_the_probe_send_the_token_on_every_call() -> None:
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer s3cret"
            body = json.dumps({"status": "RUNNING", "logs": "x", "version": "1"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = raywatch.Session(address, timeout=5)
        client.token = "s3cret"
        info = client.get_job_info("s")
        assert info is not None and info["status"] == "RUNNING"
        assert client.get_job_logs("s") == "x"
        assert rayhealth.reachable(address, "s3cret") is None
        assert rayhealth.reachable(address, None) is None  # a refused token is an answer
        assert not rayhealth.probe("e", address).reachable  # yet the cluster's health says 401
        with pytest.raises(RuntimeError, match="401"):
            raywatch.Session(address, timeout=5).get_job_info("s")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Bearer s3cret"] * 3 + [None, None, None]
    assert rayauth.scrub("bad s3cret here", "s3cret") == "bad [redacted] here"
    assert rayauth.scrub("nothing", None) == "nothing"
