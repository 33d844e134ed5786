"""The FIRE loop's pieces without state (services/waves.py): where an epic's folders live,
the prompts its workers and judges get, a judge's verdict file read, and the secrets a check's
output is cleaned of."""

from __future__ import annotations

import os
import re
from pathlib import Path

from corral.config import Config
from corral.domain.epics import EpicRecord
from corral.domain.models import Job
from corral.waves import rules
from corral.waves.decompose import MAX_PROPOSED, PROPOSAL_FILE
from corral.waves.epic import TaskSpec
from corral.waves.rules import Confidence, JudgeVerdict, Verdict
from corral.workers.agentfiles import read_agent_json

VERDICT_FILE = "verdict.json"
MAX_VERDICT_BYTES = 64 * 1024  # a verdict, a confidence and an insight: far less than this
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.I)


def epic_root(config: Config, epic_id: str) -> Path:
    """Where an epic's worktrees and judges' folders live, under the data directory."""
    return config.data_dir / "epics" / epic_id


def worker_prompt(epic: EpicRecord, task: TaskSpec, attempt: int, work: Path) -> str:
    """A worker's prompt: the task's, then where it works, its checks and that it must not
    commit."""
    checks = "\n".join(f"- `{c}`" for c in task.checks) or "- (none)"
    return (
        f"{task.prompt}\n\n"
        f"(Task {task.id} of epic {epic.name}, try {attempt}. You work in {work}, a git "
        "worktree of the project; leave your changes in the working tree: Corral commits them "
        "once these checks pass and a council reviews them; do not commit or push.)\n"
        f"Checks:\n{checks}\n"
    )


def start_file(work: Path) -> Path:
    """Beside a try's worktree: the commit it started from (written first, removed last)."""
    return work.with_name(work.name + ".start")


def task_brief(task: TaskSpec) -> str:
    """The task as a judge or a decomposer reads it in task.md: its prompt and its checks."""
    checks = "\n".join(f"- `{c}`" for c in task.checks) or "- (none)"
    return f"# Task {task.id}\n\n{task.prompt}\n\nChecks:\n{checks}\n"


def judge_prompt(task: TaskSpec, attempt: int, folder: Path) -> str:
    """A judge's prompt: what to read, and the verdict file to write with its schema."""
    return (
        "You are a judge on a council reviewing one task's change. Read task.md (the task) and "
        f"diff.patch (the change) in {folder}. Then write {folder / VERDICT_FILE}: a JSON "
        'object {"verdict": "PASS" | "WARN" | "FAIL", "confidence": "HIGH" | "MEDIUM" | "LOW", '
        '"key_insight": "<one sentence>", "findings": [{"severity": "critical" | "significant" '
        '| "minor", "description": "..."}]}. Write any longer analysis to analysis.md there; '
        f"only the verdict travels. The task is {task.id}, try {attempt}."
    )


def decompose_prompt(task: TaskSpec, attempts: int, folder: Path) -> str:
    """A decomposer's prompt: what to read, and the proposal file to write with its schema."""
    return (
        f"Task {task.id} of an epic failed all of its {attempts} tries. Read task.md (the task, "
        f"its checks and why its last try failed) and diff.patch (that try's change, if any) in "
        f"{folder}. Split the task into smaller tasks that together do what it asks, each small "
        f"enough for one fresh agent. Then write {folder / PROPOSAL_FILE}: a JSON object "
        '{"tasks": [{"id": "<a-z0-9_->", "prompt": "<what this task does>", "depends_on": '
        '["<ids of proposed tasks it needs first>"]}]} with 1 to '
        f"{MAX_PROPOSED} tasks and no other keys: Corral gives them the task's role, and the "
        "last ones its checks. Do not change the project's files."
    )


def known_secrets(config: Config) -> list[str]:
    """The values a check's output is cleaned of: the workers' variables and handed-on keys,
    and the engine's own credential-like variables."""
    out = []
    for spec in config.settings.workers.values():
        out += list(spec.env.values())
        out += [os.environ[k] for k in spec.pass_env if k in os.environ]
    out += [v for k, v in os.environ.items() if _SECRET_NAME.search(k)]
    return out


def verdict_of(path: Path, job: Job) -> JudgeVerdict:
    """A judge's verdict file, or a FAIL saying why there is none (a judge that could not judge
    blocks the try: verify, then trust)."""
    try:
        return rules.read_verdict(read_agent_json(path, MAX_VERDICT_BYTES), job.worker)
    except (OSError, ValueError, rules.VerdictError) as err:
        why = f"judge job {job.id} ({job.state.value}) left no valid {VERDICT_FILE}: {err}"
        return JudgeVerdict(
            verdict=Verdict.FAIL, confidence=Confidence.LOW, vendor=job.worker, key_insight=why
        )
