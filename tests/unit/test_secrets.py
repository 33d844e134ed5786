"""Secrets in a submission: what is stored redacted, what is sealed, and what an attempt gets."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.domain.errors import WorkerError
from corral.domain.models import Job, JobOptions, JobSpec, Limits
from corral.domain.settings import EnvSpec, RoleSpec, Settings
from corral.domain.states import DedupMode, JobState
from corral.policy.guardrails import load_rules
from corral.policy.redact import MARK
from corral.policy.secrets import Parts, conceal, reveal, secret_values
from corral.runtime.gate import PrerunGate
from corral.services.submissions import Submissions
from corral.store.memory import MemoryStore
from corral.workers.sealing import Keeper, reveal_job, revealer

CANARY = "corral-canary-seal-0d9e71"
KEY = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


@pytest.mark.parametrize(
    ("parts", "marked", "stored"),
    [
        # a variable named like a secret: its value, wherever it appears
        (
            Parts(command=("deploy", f"--pw={CANARY}"), env={"API_TOKEN": CANARY}),
            (),
            Parts(command=("deploy", f"--pw={MARK}"), env={"API_TOKEN": MARK}),
        ),
        # a variable marked secret (--secret-env NAME with --setenv NAME=…)
        (
            Parts(command=("run",), env={"PLAIN": CANARY}, prompt=f"use {CANARY}"),
            ("PLAIN",),
            Parts(command=("run",), env={"PLAIN": MARK}, prompt=f"use {MARK}"),
        ),
        # credential shapes nobody declared: in argv, in values of ordinary variables, in a prompt
        (
            Parts(
                command=("curl", "-H", f"x-api-key: {KEY}"),
                env={"DB_URL": "postgresql://app:pa55word@db/x"},
                prompt=f"key {KEY}",
            ),
            (),
            Parts(
                command=("curl", "-H", f"x-api-key: {MARK}"),
                env={"DB_URL": f"postgresql://app:{MARK}@db/x"},
                prompt=f"key {MARK}",
            ),
        ),
    ],
)
def test_a_submission_is_stored_redacted_and_its_real_values_come_back(
    parts: Parts, marked: tuple[str, ...], stored: Parts
) -> None:
    c = conceal(parts, marked)
    assert c.stored == stored
    assert CANARY not in json.dumps([c.stored.command, dict(c.stored.env), c.stored.prompt])
    assert reveal(c.stored, json.loads(json.dumps(c.hidden))) == parts  # as the seal keeps it


def test_a_submission_without_secrets_is_stored_as_it_is() -> None:
    parts = Parts(command=("make", "test"), env={"MODE": "fast", "TOKENS": ""}, prompt="hi")
    c = conceal(parts)
    assert (c.stored, c.hidden) == (parts, {})


def test_every_secret_of_the_real_parts_is_listed_for_the_attempts_output() -> None:
    parts = Parts(command=("x", f"--key={KEY}"), env={"MY_SECRET": CANARY, "N": "1"})
    assert secret_values(parts) == [CANARY, KEY]


def test_a_sealed_payload_opens_with_its_key_only(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path / "secrets.key")
    token = keeper.seal({"env": {"A": CANARY}})
    assert CANARY not in token and token.startswith("v1.")
    assert (tmp_path / "secrets.key").stat().st_mode & 0o777 == 0o600
    assert Keeper(tmp_path / "secrets.key").unseal(token) == {"env": {"A": CANARY}}
    other = Keeper(tmp_path / "other.key")
    other.seal({})  # a key of its own
    with pytest.raises(WorkerError, match="cannot open the job's sealed secrets"):
        other.unseal(token)
    with pytest.raises(WorkerError, match="key that sealed this job's secrets is missing"):
        Keeper(tmp_path / "missing.key").unseal(token)


def test_processes_creating_the_key_at_once_agree_on_one(tmp_path: Path) -> None:
    keepers = [Keeper(tmp_path / "secrets.key") for _ in range(8)]
    tokens: list[str] = []
    threads = [
        threading.Thread(target=lambda k=k: tokens.append(k.seal({"n": 1}))) for k in keepers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(Keeper(tmp_path / "secrets.key").unseal(t) == {"n": 1} for t in tokens)
    assert [p.name for p in tmp_path.iterdir()] == ["secrets.key"]  # no temporary file left


def test_the_store_holds_the_job_redacted_and_the_attempt_runs_it_real(tmp_path: Path) -> None:
    spec = JobSpec(
        command=("sh", "-c", f"echo {KEY}"),
        env={"DB_PASSWORD": CANARY},
        options=JobOptions(secret_env=("FROM_ENGINE",)),
        env_name="local",
    )
    store = MemoryStore()
    keeper = Keeper(tmp_path / "secrets.key")
    svc = Submissions(
        store,
        Settings(
            roles={"default": RoleSpec(name="default")},
            environments={"local": EnvSpec(name="local")},
        ),
        lambda: 1000.0,
        frozenset({"command"}),
        conceal=keeper.conceal,
    )

    async def main() -> Any:
        await store.open()
        job = (await svc.submit(spec)).job
        return await store.get_job(job.id)

    job = anyio.run(main)
    assert (job.command, dict(job.env)) == (("sh", "-c", f"echo {MARK}"), {"DB_PASSWORD": MARK})
    assert CANARY not in json.dumps(job.options.to_json()) and job.options.sealed
    real = reveal_job(job, Keeper(tmp_path / "secrets.key"), {"FROM_ENGINE": "engine-side-val"})
    assert real.job.command == ("sh", "-c", f"echo {KEY}")
    assert dict(real.job.env) == {"DB_PASSWORD": CANARY, "FROM_ENGINE": "engine-side-val"}
    assert set(real.secrets) == {CANARY, KEY, "engine-side-val"}
    with pytest.raises(WorkerError, match="--secret-env FROM_ENGINE: the engine's environment"):
        reveal_job(job, keeper, {})


def test_guardrails_at_spawn_judge_the_command_that_runs_and_record_it_redacted(
    tmp_path: Path,
) -> None:
    rules = load_rules(
        "roles:\n  ops:\n    - {id: no-evil, when: {command: 'curl *evil-host*'},"
        " verdict: deny, reason: evil_host}\n"
    )
    keeper = Keeper(tmp_path / "secrets.key")
    job = keeper.conceal(
        Job(
            id="j1",
            state=JobState.QUEUED,
            role="ops",
            worker="command",
            env_name="local",
            priority=2,
            tenant="default",
            command=("curl", "https://evil-host.example/x"),
            prompt=None,
            cwd=None,
            env={"TARGET_TOKEN": "evil-host.example"},
            options=JobOptions(secret_env=("FROM_ENGINE",)),
            limits=Limits(),
            key=None,
            dedup=DedupMode.COALESCE,
            workspace=None,
            parent_id=None,
            depth=0,
            created_at=0,
            updated_at=0,
            sort_at=0,
        )
    )
    assert job.command == ("curl", f"https://{MARK}/x")  # what the store keeps passes…
    gate = PrerunGate(MemoryStore(), guardrails=rules, reveal=revealer(keeper))
    verdict = gate._spawn_guardrails(job)  # …but the command that would run does not
    assert verdict is not None and verdict.reason == "evil_host"
    assert "evil-host" not in f"{verdict.message} {verdict.command}"
