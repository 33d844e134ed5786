"""The Ray worker's pure parts: the submission id, the log copy by byte offset (resumed without
duplicates), the watcher's command line (no environment value in it), what a helper's note
makes of an attempt's result, the environment's breaker, and notebook parameters."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from corral.config import parse, resolve
from corral.core.breakers import breaker_names, remote_envs
from corral.domain.errors import ConfigError, InvalidRequest, WorkerMisconfigured
from corral.domain.models import AttemptResult
from corral.domain.settings import EnvSpec, Settings
from corral.domain.states import Fault, Outcome
from corral.services import notebooks
from corral.services.submissions import SubmitRequest
from corral.workers import rayauth, rayhealth, rayjob
from corral.workers.command import with_note
from corral.workers.notes import read_note, write_note
from tests.unit.test_retry import job


class Logs:
    """Ray's `get_job_logs`: the whole log so far, each time."""

    def __init__(self) -> None:
        self.text = ""

    def get_job_logs(self, sid: str) -> str:
        return self.text


def test_a_submission_id_is_the_same_for_the_same_attempt() -> None:
    assert rayjob.submission_id("j1", 2) == rayjob.submission_id("j1", 2) == "corral-j1-2"
    assert rayjob.submission_id("j1", 3) != rayjob.submission_id("j1", 2)


def test_logs_are_copied_from_the_offset_reached_never_twice(tmp_path: Path) -> None:
    client, out, offset = Logs(), io.BytesIO(), tmp_path / rayjob.OFFSET_FILE
    client.text = "line 1\nline 2\n"
    rayjob._copy_logs(client, "s", offset, out)
    client.text += "línea 3\n"  # bytes, not characters, are counted
    rayjob._copy_logs(client, "s", offset, out)
    rayjob._copy_logs(client, "s", offset, out)  # nothing new: nothing written
    resumed = io.BytesIO()  # a watcher started again resumes at the offset
    client.text += "last\n"
    rayjob._copy_logs(client, "s", offset, resumed)
    assert out.getvalue().decode() == "line 1\nline 2\nlínea 3\n"
    assert resumed.getvalue() == b"last\n"
    assert int(offset.read_text()) == len(client.text.encode())


def test_the_watchers_command_names_the_environment_but_holds_no_value(tmp_path: Path) -> None:
    argv = rayjob.argv(
        address="http://127.0.0.1:8265",
        sid="corral-j-1",
        attempt_dir=tmp_path,
        command=["python", "train.py"],
        env_keys=["API_TOKEN", "CORRAL_JOB_ID"],
        grace_s=9,
        resources={"num_cpus": 1, "num_gpus": 0.5},
    )
    assert argv[1:3] == ["-m", "corral.workers.rayjob"]
    assert argv[argv.index("--") + 1 :] == ["python", "train.py"]
    assert argv[argv.index("API_TOKEN") - 1 : argv.index("API_TOKEN") + 1] == [
        "--pass-env",
        "API_TOKEN",
    ]
    assert "--resource" in argv and "num_gpus=0.5" in argv


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
    argv = rayjob.argv(
        address="http://h",
        sid="s",
        attempt_dir=Path("/a"),
        command=["true"],
        env_keys=[],
        grace_s=1,
        runtime_env=env.runtime_env,
    )
    assert json.loads(argv[argv.index("--runtime-env") + 1]) == env.runtime_env
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
        client = rayjob.RestJobs(address, timeout=5, token="s3cret")
        assert client.get_job_info("s").status == "RUNNING"
        assert client.get_job_logs("s") == "x"
        assert rayhealth.reachable(address, "s3cret") is None
        assert rayhealth.reachable(address, None) is None  # a refused token is an answer
        assert not rayhealth.probe("e", address).reachable  # yet the cluster's health says 401
        with pytest.raises(RuntimeError, match="401"):
            rayjob.RestJobs(address, timeout=5).get_job_info("s")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Bearer s3cret"] * 3 + [None, None, None]
    assert rayauth.scrub("bad s3cret here", "s3cret") == "bad [redacted] here"
    assert rayauth.scrub("nothing", None) == "nothing"
