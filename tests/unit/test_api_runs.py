"""A training job through the API and the dashboard, in process: the `training` body made a
training job (its bad forms refused), `GET /api/v1/jobs/{id}/runs` with the run's config,
summary and loss curve read from a run file the pinned wandb wrote, and the dashboard's run list
and loss curve (inline SVG, no script, the run's values escaped)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.domain.models import JobEvent
from tests.unit.test_api_jobs import assert_problem, config
from tests.unit.test_ui import Ui, with_ui
from tests.unit.test_wandbfile import write_run

pytest.importorskip("wandb", reason="the training extra is part of the dev set-up")

pytestmark = pytest.mark.training

EVIL = "<script>alert(1)</script>"
WRITER = f"""
import wandb
run = wandb.init(id="corral-RUN-1", config={{"note": {EVIL!r}}}, tags=["corral"])
for step in range(5):
    run.log({{"train/loss": 2.0 - step * 0.25}})
run.finish()
"""


def test_training_runs_through_the_api_and_the_dashboard(tmp_path: Path) -> None:
    run_file = write_run(tmp_path, WRITER, "corral-RUN-1")

    async def body(u: Ui) -> None:
        h = {"Authorization": f"Bearer {u.tok['admin']}"}
        made = await u.client.post(
            "/api/v1/jobs",
            headers=h,
            json={
                "training": {"method": "grpo", "script": "train.py", "args": ["--lr", "1"]},
                "cwd": str(tmp_path),
            },
        )
        assert made.status_code == 201, made.text
        job = made.json()["job"]
        assert job["training"]["method"] == "grpo"
        assert job["training"]["script"] == str(tmp_path / "train.py")
        for bad, says in (
            ({"training": {"method": "ppo", "script": "/t.py"}}, "method"),
            ({"training": {"method": "sft", "script": "t.py"}}, "cwd"),
            ({"training": {"method": "sft", "script": "/t.py"}, "command": ["x"]}, "not `com"),
        ):
            r = await u.client.post("/api/v1/jobs", headers=h, json=bad)
            assert says in str(r.json()), r.text
            assert r.status_code == 422
        await u.store.append_events(
            [
                JobEvent(
                    job_id=job["id"],
                    at=time.time(),
                    kind="training",
                    attempt=1,
                    message="training run corral-RUN-1",
                    data={
                        "method": "grpo",
                        "run_id": "corral-RUN-1",
                        "run_file": str(run_file),
                        "wandb_mode": "offline",
                        "repo_id": "me/model",
                        "revision": "abc123",
                        "exit_code": 0,
                    },
                )
            ]
        )
        runs = await u.api("GET", f"/api/v1/jobs/{job['id']}/runs")
        (run,) = runs["runs"]
        assert run["run_id"] == "corral-RUN-1" and run["repo_id"] == "me/model"
        assert run["config"] == {"note": EVIL}
        assert run["loss_metric"] == "train/loss"
        assert run["loss"] == [[float(i), 2.0 - i * 0.25] for i in range(5)]
        assert run["summary"]["train/loss"] == 1.0
        shown = await u.api("GET", f"/api/v1/jobs/{job['id']}")
        assert shown["runs"] == runs["runs"]
        plain = await u.submit()
        assert (await u.api("GET", f"/api/v1/jobs/{plain}/runs"))["runs"] == []
        assert_problem(
            await u.client.get(
                f"/api/v1/jobs/{job['id']}/runs",
                headers={"Authorization": f"Bearer {u.tok['other']}"},
            ),
            404,
            "not_found",
        )
        await u.login("admin")
        page = await u.client.get(f"/ui/jobs/{job['id']}")
        assert page.status_code == 200, page.text
        html = page.text
        assert 'id="training-runs"' in html and "corral-RUN-1" in html
        assert "<polyline points=" in html and 'class="chart loss"' in html
        assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script>" not in html.split("</head>")[-1]  # no inline script in the body

    with_ui(config(tmp_path), body)
