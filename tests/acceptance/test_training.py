"""Training jobs end to end through Corral on a private Ray head on loopback, on a CPU, with the
example scripts' tiny models: SFT, DPO and GRPO each succeed with their W&B run linked (the job
id in the run's config and tags) and their loss series read back from the offline run file, the
model recorded with its revision; a cancel mid-training stops the Ray job and every process of
it; a timeout is TIMED_OUT; a regression against a baseline is an incident; the secrets the
role declares reach the script only through its secrets file (canary across Ray's job API, its
logs, the store, the traces, the metrics and the API).

One Ray head serves the module (tests/acceptance/rayhead.py)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.workers.proctab import alive
from tests.acceptance.conftest import Corral
from tests.acceptance.rayhead import Head, free_port, running_head
from tests.helpers import eventually

pytest.importorskip("ray.job_submission", reason="the ray extra is part of the dev set-up")
pytest.importorskip("trl", reason="the training extra is part of the dev set-up")


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    with running_head() as h:
        yield h


pytestmark = pytest.mark.training

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "training"

# a script that trains nothing: it proves what it was given, and that its secrets were not in
# its environment or its argv
CANARY_SCRIPT = """\
import hashlib, json, os, sys
from corral import runtime_script as rs
token = rs.secret("HF_TOKEN")
print("sha", hashlib.sha256(token.encode()).hexdigest())
print("env-has-token", "HF_TOKEN" in os.environ, "argv-has-token", token in " ".join(sys.argv))
print("ids", rs.job_id(), rs.run_id(), os.environ["WANDB_MODE"], rs.checkpoint_dir() is not None)
print("secrets-at", os.environ["CORRAL_SECRETS_FILE"])
"""

# a run that logs the loss series it is given, as TRL's W&B callback names it: the comparison
# with a baseline reads only the runs' final metrics, and three real trainings cost a worker a
# minute and a half of a shared 2-core machine (the first test proves TRL's runs are read)
LOSSES_SCRIPT = """\
import sys, wandb
run = wandb.init()
for step, loss in enumerate(float(v) for v in sys.argv[1].split(",")):
    run.log({"train/loss": loss}, step=step)
run.finish()
"""

# a long training run that says who it is first (for the cancel and the timeout)
LONG_SCRIPT = """\
import os, runpy, sys
open("train-pid", "w").write(str(os.getpid()))
sys.argv = [sys.argv[0], "--max-steps", "100000"]
sys.path.insert(0, {examples!r})
runpy.run_path({sft!r}, run_name="__main__")
"""


def _holds_secrets(path: str) -> bool:
    """Whether `path` (/proc/PID/fd/N) is still a Corral secrets file (a reused PID's fd N is
    something else)."""
    try:
        return "corral-secrets" in os.readlink(path)
    except OSError:
        return False


def _config(head: Head) -> str:
    return f"""\
scheduler:
  poll_interval_s: 0.2
# training starves a shared 2-core machine for seconds at a time: the core's heart-beat must
# not take that for a hung core (the default 5 s did, and the engine stopped starting work)
core: {{heartbeat_timeout_s: 60}}
roles:
  default:
    concurrency: 16
    retry: {{base_s: 0.05, cap_s: 0.2}}
  trainer:
    concurrency: 8
    retry: {{base_s: 0.05, cap_s: 0.2}}
    secret_env: [HF_TOKEN]
environments:
  local:
    max_inflight: 8
  gpu:
    kind: ray
    address: {head.address}
    max_inflight: 4
    num_cpus: 1
    secret_env: [WANDB_API_KEY]
    # one thread per torch: three trainings at once on two cores, not three times two
    runtime_env:
      env_vars: {{HF_HUB_OFFLINE: "1", OMP_NUM_THREADS: "1", TOKENIZERS_PARALLELISM: "false"}}
"""


@pytest.fixture
def trainer(tmp_path: Path, head: Head, monkeypatch: pytest.MonkeyPatch) -> Iterator[Corral]:
    monkeypatch.setenv("HF_TOKEN", "hf_canary_" + os.urandom(8).hex())
    monkeypatch.setenv("WANDB_API_KEY", "wb_canary_" + os.urandom(8).hex())
    c = Corral(tmp_path, _config(head))
    try:
        yield c
    finally:
        c.stop_all()


def _submit(c: Corral, method: str, script: str, *opts: str, args: tuple[str, ...] = ()) -> str:
    base = ("submit", "--role", "trainer", "--env", "gpu", "--training", method)
    return c.ok(*base, "--script", script, *opts, "--", *args).strip()


def test_sft_dpo_and_grpo_run_on_ray_with_their_wandb_runs_linked(
    trainer: Corral, head: Head
) -> None:
    c = trainer
    hub = c.work / "hub"
    jobs = {
        m: _submit(
            c, m, str(EXAMPLES / f"{m}.py"), args=("--hub-repo", f"me/{m}", "--hub-dir", str(hub))
        )
        for m in ("sft", "dpo", "grpo")
    }
    c.serve()
    for method, job in jobs.items():
        assert c.wait(job, timeout=600) == 0, (method, c.ok("logs", job)[-3000:])
    for method, job in jobs.items():
        assert [j.status.value for j in head.jobs(job)] == ["SUCCEEDED"]
        shown = c.job(job)
        assert shown["training"]["method"] == method
        (run,) = shown["runs"]
        assert run["run_id"] == f"corral-{job}-1" and run["wandb_mode"] == "offline"
        assert run["error"] is None, run
        assert run["config"]["corral_job_id"] == job
        assert set(run["tags"]) >= {"corral", f"corral-job-{job}"}
        assert run["loss_metric"] == "train/loss"
        assert [step for step, _ in run["loss"]] and len(run["loss"]) == 3, run["loss"]
        assert run["summary"]["train/loss"] == pytest.approx(run["loss"][-1][1])
        assert run["repo_id"] == f"me/{method}"
        assert (hub / "me" / method / "model.safetensors").is_file()
        assert run["revision"] and f"revision {run['revision']}" in c.ok("logs", job)
        text = c.ok("show", job)
        assert f"training run corral-{job}-1" in text and f"model me/{method}" in text


def test_a_worse_run_than_its_baseline_is_a_metric_regression(trainer: Corral) -> None:
    c = trainer
    script = c.work / "losses.py"
    script.write_text(LOSSES_SCRIPT)
    losses = str(script)
    base = _submit(c, "sft", losses, args=("2.0,1.5,1.2",))
    # a final loss 1.25 against the baseline's 1.2 is 4% worse: over a 0.1% threshold, a
    # regression; under 5000% (`same`), none
    worse = _submit(
        c, "sft", losses, "--compare-to", base, "--after", base,
        "--regression-threshold", "0.001", args=("2.0,1.6,1.25",),
    )  # fmt: skip
    same = _submit(
        c, "sft", losses, "--compare-to", base, "--watch", "train/loss", "--after", base,
        "--regression-threshold", "50", args=("2.0,1.6,1.25",),
    )  # fmt: skip
    c.serve()
    for job in (base, worse, same):
        assert c.wait(job, timeout=600) == 0, c.ok("logs", job)[-2000:]
    (incident,) = c.json("incidents", worse)
    assert incident["type"] == "metric_regression", incident
    assert incident["context"]["baseline_job"] == base
    assert c.json("incidents", same) == []
    compared = [e for e in c.job(worse)["timeline"] if e["kind"] == "metric_comparison"]
    assert len(compared) == 1 and compared[0]["message"].startswith("metric regression against")
    (m,) = compared[0]["data"]["metrics"]
    assert m["metric"] == "train/loss" and m["regressed"]
    assert (m["value"], m["baseline"]) == (pytest.approx(1.25), pytest.approx(1.2))
    fine = [e for e in c.job(same)["timeline"] if e["kind"] == "metric_comparison"]
    assert fine[0]["message"] == f"no regression against {base}"


# a run that only waits, for the timeout: the clock and the stop are what is tested, and a real
# training burning a core for the whole timeout slowed every other test of the suite
WAIT_SCRIPT = """\
import os, signal
open("train-pid", "w").write(str(os.getpid()))
signal.pause()  # until the timeout stops it
"""


def _long(c: Corral) -> str:
    script = c.work / "long.py"
    script.write_text(LONG_SCRIPT.format(examples=str(EXAMPLES), sft=str(EXAMPLES / "sft.py")))
    return str(script)


def test_cancel_mid_training_stops_the_ray_job_and_its_processes(
    trainer: Corral, head: Head
) -> None:
    c = trainer
    job = _submit(c, "sft", _long(c), "--max-attempts", "1")
    c.serve()
    pid_file = c.work / "train-pid"
    eventually(pid_file.exists, timeout=90, what="the training script running")
    pid = int(pid_file.read_text())
    eventually(lambda: "wandb" in c.ok("logs", job), timeout=90, what="training under way")
    assert alive(pid)
    c.ok("cancel", job)
    assert c.wait(job, timeout=60) == 130
    assert [j.status.value for j in head.jobs(job)] == ["STOPPED"]
    eventually(lambda: not alive(pid), timeout=20, what="the training process gone")
    assert c.job(job)["state"] == "CANCELLED"


def test_a_training_job_past_its_timeout_is_timed_out(trainer: Corral, head: Head) -> None:
    c = trainer
    script = c.work / "wait.py"
    script.write_text(WAIT_SCRIPT)
    job = _submit(c, "sft", str(script), "--timeout", "20", "--max-attempts", "1")
    c.serve()
    eventually((c.work / "train-pid").exists, timeout=90, what="the training script running")
    pid = int((c.work / "train-pid").read_text())
    assert c.wait(job, timeout=120) == 124
    shown = c.job(job)
    assert shown["state"] == "TIMED_OUT" and shown["limit_hit"] == "max_duration_s", shown
    assert [j.status.value for j in head.jobs(job)] == ["STOPPED"]
    eventually(lambda: not alive(pid), timeout=20, what="the training process gone")


def _get(url: str, token: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(r.read().decode())


def test_the_secrets_reach_the_script_only_through_its_file(trainer: Corral, head: Head) -> None:
    c = trainer
    hf, wb = os.environ["HF_TOKEN"], os.environ["WANDB_API_KEY"]
    script = c.work / "canary.py"
    script.write_text(CANARY_SCRIPT)
    job = _submit(c, "sft", str(script), "--max-attempts", "1")
    port = free_port()
    token = c.ok("token", "create", "--tenant", "default", "--scopes", "jobs:read,metrics")
    token = token.strip()
    c.serve("--http", f"127.0.0.1:{port}")
    assert c.wait(job, timeout=120) == 0, c.engine_log()[-3000:]
    logs = c.ok("logs", job)
    assert hashlib.sha256(hf.encode()).hexdigest() in logs  # the script had it
    assert "env-has-token False argv-has-token False" in logs
    assert f"ids {job} corral-{job}-1 offline True" in logs
    sid = f"corral-{job}-1"
    base = f"http://127.0.0.1:{port}"
    seen = {
        "ray job info": head.raw(sid),
        "ray job logs": head.client().get_job_logs(sid),
        "corral logs": logs,
        "show": c.ok("show", job, "--json"),
        "trace": c.run("trace", job, "--json").stdout,
        "events": c.ok("events", "--json"),
        "metrics": c.ok("metrics"),
        "api job": _get(f"{base}/api/v1/jobs/{job}", token),
        "api runs": _get(f"{base}/api/v1/jobs/{job}/runs", token),
        "api metrics": _get(f"{base}/metrics", token),
    }
    for where, text in seen.items():
        assert hf not in text and wb not in text, where
    for path in c.data.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert hf.encode() not in data and wb.encode() not in data, path
    # held in memory by the runner, never on a disk, and gone with it
    at = re.search(r"secrets-at (\S+)", logs)
    assert at and re.fullmatch(r"/proc/\d+/fd/\d+", at[1]), logs
    assert not _holds_secrets(at[1])
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert hf not in ps
