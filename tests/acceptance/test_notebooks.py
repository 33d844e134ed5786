"""Notebook jobs run locally (no Ray): a notebook that succeeds and one whose cell fails are
both copied back atomically with their sha256 (recorded on the job's timeline), the parameters
reach the parameters cell and are recorded on the job, the copyback hook (a command, or a POST
to a loopback URL) sees the copy, and the failing cell (ename, evalue) is the attempt's
error."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from tests.acceptance.conftest import Corral
from tests.acceptance.notebooks import NOTEBOOK_BAD, NOTEBOOK_OK, write_notebook

pytest.importorskip("papermill", reason="the notebook extra is part of the dev set-up")


@pytest.fixture
def hook_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def test_notebooks_succeed_and_fail_and_are_both_copied_back(
    corral: Corral, hook_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, received = hook_server
    write_notebook(corral.work / "ok.ipynb", NOTEBOOK_OK)
    write_notebook(corral.work / "bad.ipynb", NOTEBOOK_BAD)
    ok = corral.ok(
        "submit", "--notebook", "ok.ipynb", "-P", "x=21", "--copyback", "out",
        "--copyback-url", url,
    ).strip()  # fmt: skip
    hook = 'printf "%s %s" "$CORRAL_NOTEBOOK" "$CORRAL_NOTEBOOK_SHA256" > hooked'
    bad = corral.ok(
        "submit", "--notebook", "bad.ipynb", "--copyback", "out", "--max-attempts", "1",
        "--copyback-hook", hook,
    ).strip()  # fmt: skip
    corral.drain(timeout=120)
    assert corral.job(ok)["state"] == "SUCCEEDED", corral.ok("logs", ok)
    assert corral.job(bad)["state"] == "DEAD_LETTERED"
    out = corral.work / "out"
    digests = {}
    for name in ("ok.ipynb", "bad.ipynb"):
        record = json.loads((out / f"{name}.json").read_text())
        digests[name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert record["sha256"] == digests[name]
    assert sorted(p.name for p in out.iterdir()) == [
        "bad.ipynb",
        "bad.ipynb.json",
        "ok.ipynb",
        "ok.ipynb.json",
    ]  # no temporary file left
    executed = json.loads((out / "ok.ipynb").read_text())
    assert executed["metadata"]["papermill"]["parameters"] == {"x": 21}
    assert "result 42" in json.dumps(executed)
    failed = json.loads((out / "bad.ipynb").read_text())
    assert failed["metadata"]["papermill"]["exception"] is True
    assert received == [
        {
            "source": str(corral.work / "ok.ipynb"),
            "parameters": {"x": 21},
            "error": None,
            "path": str(out / "ok.ipynb"),
            "sha256": digests["ok.ipynb"],
        }
    ]
    assert (corral.work / "hooked").read_text() == f"{out / 'bad.ipynb'} {digests['bad.ipynb']}"
    shown = corral.job(bad)
    assert shown["last_error"].startswith("notebook cell 2 failed: ValueError: bad x 1")
    assert shown["notebook"] == {
        "source": str(corral.work / "bad.ipynb"),
        "parameters": {},
        "kernel": "python3",
        "copyback": str(out),
    }
    assert "sha256 " + digests["ok.ipynb"] in corral.ok("logs", ok)
    for job, name, error in ((ok, "ok.ipynb", None), (bad, "bad.ipynb", "ValueError")):
        [event] = [e for e in corral.job(job)["timeline"] if e["kind"] == "notebook"]
        assert event["data"]["path"] == str(out / name)
        assert event["data"]["sha256"] == digests[name]  # recorded on the job
        assert (event["data"]["error"] or "").count("ValueError") == (1 if error else 0)
    [recorded] = [e for e in corral.job(ok)["timeline"] if e["kind"] == "notebook"]
    assert recorded["data"]["parameters"] == {"x": 21}


def test_bad_notebook_submissions_are_refused_in_one_line(corral: Corral) -> None:
    for args, words in (
        (("--notebook", "x.py"), ".ipynb"),
        (("--notebook", "x.ipynb", "-P", "1x=2"), "Python name"),
        (("--notebook", "x.ipynb", "--copyback-url", "http://127.0.0.1:1/"), "--copyback"),
        (("--copyback", "out", "--", "true"), "--notebook"),
    ):
        r = corral.run("submit", *args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
