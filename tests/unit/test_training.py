"""Training jobs without a cluster: the submission (services/training.py), the regression rule
(policy/regression.py), the runner's environment for the script (workers/training.py) and the
script's runtime module (corral.runtime_script)."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

import pytest

from corral import runtime_script
from corral.domain.errors import ConfigError, InvalidRequest
from corral.policy.regression import compare
from corral.services.submissions import SubmitRequest
from corral.services.training import parse_watch, training_request
from corral.workers import training as runner


def test_a_training_request_runs_the_script_through_the_runner(tmp_path: Path) -> None:
    base = SubmitRequest(cwd=str(tmp_path), env_name="ray")
    req = training_request(
        base, "dpo", "train.py", model="m/x", dataset="d/y", args=("--max-steps", "5")
    )
    assert req.command[1:5] == ("-m", "corral.workers.training", "--method", "dpo")
    assert req.command[req.command.index("--script") + 1] == str(tmp_path / "train.py")
    assert req.command[-3:] == ("--", "--max-steps", "5")
    assert req.training == {
        "method": "dpo",
        "script": str(tmp_path / "train.py"),
        "model": "m/x",
        "dataset": "d/y",
        "args": ["--max-steps", "5"],
    }
    compared = training_request(base, "sft", "t.py", compare_to="J1", watch=("reward:max",))
    assert compared.training is not None
    assert compared.training["watch"] == [{"metric": "reward", "goal": "max"}]
    assert compared.training["threshold"] == 0.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "ppo"}, "one of sft, dpo, grpo"),
        ({"watch": ("loss",)}, "--watch goes with --compare-to"),
        ({"compare_to": " "}, "--compare-to wants a job id"),
        ({"compare_to": "J", "threshold": -1.0}, "--regression-threshold"),
        ({"model": ""}, "--model wants"),
        ({"script": "t\x00.py"}, "--script wants"),
        ({"script": " "}, "--script wants"),
        ({"args": ("a\x00b",)}, "NUL byte"),
    ],
)
def test_bad_training_requests_say_what_is_wrong(kwargs: dict[str, object], message: str) -> None:
    method = str(kwargs.pop("method", "sft"))
    script = str(kwargs.pop("script", "t.py"))
    with pytest.raises(InvalidRequest, match=message):
        training_request(SubmitRequest(), method, script, **kwargs)  # type: ignore[arg-type]


def test_watched_metrics_and_the_regression_rule() -> None:
    assert parse_watch(["a", "b:max", "c:min", "d:x"]) == [
        {"metric": "a", "goal": "min"},
        {"metric": "b", "goal": "max"},
        {"metric": "c", "goal": "min"},
        {"metric": "d:x", "goal": "min"},
    ]
    watch = parse_watch(["loss", "reward:max", "gone"])
    found = compare(
        {"loss": 1.3, "reward": 0.5, "gone": "n/a"}, {"loss": 1.0, "reward": 0.6}, watch, 0.1
    )
    by = {c.metric: c for c in found}
    assert by["loss"].regressed and by["loss"].change == pytest.approx(0.3)
    assert by["reward"].regressed is True  # 0.5 vs 0.6: 16.7% worse for a max metric
    assert by["gone"].regressed is False and by["gone"].change is None
    better = compare({"loss": 0.9}, {"loss": 1.0}, parse_watch(["loss"]), 0.1)
    assert not better[0].regressed and better[0].change == pytest.approx(-0.1)
    zero = compare({"loss": 0.05}, {"loss": 0.0}, parse_watch(["loss"]), 0.1)
    assert zero[0].change == pytest.approx(0.05) and not zero[0].regressed


def test_the_runner_moves_secrets_out_of_the_environment_into_a_sealed_memory_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "attempt"
    work.mkdir()
    held: list[int] = []

    def hold(secrets: dict[str, str]) -> int:
        held.append(runner.secrets_memfd(secrets))
        return held[-1]

    base = {
        "CORRAL_JOB_ID": "J9",
        "CORRAL_ATTEMPT": "3",
        "CORRAL_SECRET_NAMES": "HF_TOKEN,WANDB_API_KEY,ABSENT",
        "HF_TOKEN": "hf-secret",
        "WANDB_API_KEY": "wb-secret",
        "PLAIN": "x",
    }
    args = argparse.Namespace(method="grpo", wandb_project=None)
    env = runner.script_env(args, work, hold, base)
    assert "HF_TOKEN" not in env and "WANDB_API_KEY" not in env and "CORRAL_SECRET_NAMES" not in env
    assert env["PLAIN"] == "x"
    assert env["WANDB_RUN_ID"] == "corral-J9-3" and env["WANDB_MODE"] == "offline"
    assert env["WANDB_TAGS"] == "corral,corral-job-J9"
    assert env["CORRAL_CHECKPOINT_DIR"] == str(work / "checkpoints")
    secrets_file = Path(env["CORRAL_SECRETS_FILE"])
    assert secrets_file == Path(f"/proc/{os.getpid()}/fd/{held[0]}")  # in memory, not on a disk
    assert stat.S_IMODE(os.fstat(held[0]).st_mode) == 0o600
    assert json.loads(secrets_file.read_text()) == {
        "HF_TOKEN": "hf-secret",
        "WANDB_API_KEY": "wb-secret",
    }
    with pytest.raises(PermissionError):  # sealed: the script cannot change what others read
        secrets_file.write_text("{}")
    config = json.loads(Path(env["WANDB_SWEEP_PARAM_PATH"]).read_text())
    assert config["corral_job_id"] == {"value": "J9"}
    assert "hf-secret" not in json.dumps(env) and "wb-secret" not in json.dumps(env)

    # the script's side: corral.runtime_script reads them from the file
    for key in list(os.environ):
        if key.startswith(("CORRAL_", "WANDB_")) or key in ("HF_TOKEN",):
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(("CORRAL_", "WANDB_")):
            monkeypatch.setenv(key, value)
    assert runtime_script.in_job() and runtime_script.job_id() == "J9"
    assert runtime_script.attempt() == 3 and runtime_script.run_id() == "corral-J9-3"
    assert runtime_script.secret("HF_TOKEN") == "hf-secret"
    assert runtime_script.secret("NOPE", "d") == "d"
    assert runtime_script.export_secrets() == ["HF_TOKEN", "WANDB_API_KEY"]
    assert os.environ["HF_TOKEN"] == "hf-secret"
    runtime_script.record_model(repo_id="me/m", revision="abc")
    assert json.loads(Path(env["CORRAL_TRAINING_RESULT"]).read_text()) == {
        "repo_id": "me/m",
        "revision": "abc",
    }
    os.close(held[0])  # the runner has ended: the secrets are gone with it
    with pytest.raises(runtime_script.SecretsUnavailable):
        runtime_script.secrets()
    not_an_object = tmp_path / "list.json"
    not_an_object.write_text("[1]")
    monkeypatch.setenv("CORRAL_SECRETS_FILE", str(not_an_object))
    with pytest.raises(runtime_script.SecretsUnavailable):
        runtime_script.secrets()


def test_roles_and_environments_declare_secrets_every_job_gets(tmp_path: Path) -> None:
    from corral.config import load
    from corral.services.submissions import spec_for

    (tmp_path / "corral.yaml").write_text(
        "roles:\n  trainer: {secret_env: [HF_TOKEN]}\n"
        "environments:\n  gpu: {secret_env: [WANDB_API_KEY, HF_TOKEN]}\n"
    )
    cfg = load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")
    spec = spec_for(
        SubmitRequest(role="trainer", env_name="gpu", secret_env=("MINE",)), cfg.settings
    )
    assert spec.options.secret_env == ("HF_TOKEN", "MINE", "WANDB_API_KEY")
    plain = spec_for(SubmitRequest(command=("true",)), cfg.settings)
    assert plain.options.secret_env == ()
    (tmp_path / "corral.yaml").write_text("roles:\n  r: {secret_env: ['not a name']}\n")
    with pytest.raises(ConfigError, match="secret_env"):
        load(data_dir=tmp_path / "data", config_path=tmp_path / "corral.yaml")
