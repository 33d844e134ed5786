"""Whose failure an attempt's end was: the job's own, or its worker's and provider's.

Circuit breakers and the crash-loop rule count only the worker's failures
(docs/explanation/design.md, "Whose failure"), and a configuration fault is never retried.
Pure functions of what the worker saw, table-tested in tests/unit/test_faults.py.

command kinds — the worker is `corral-shim`:
  worker: the shim could not start or fork, or vanished without a result (LOST);
  job: everything the command did itself — any exit code or signal, its deadline, a program or
  working directory that does not exist (`exec:` / `chdir:` spawn errors).

agent CLIs (claude-code, codex, opencode) — the worker is the CLI and its model API:
  config: the model API refused the credentials (401/403), the CLI is not logged in or misses its
  API key, the model does not exist (404 or the CLI says so);
  worker: the model API answered 429/5xx or an error without a status, or the CLI was still
  retrying a failed call; the CLI ended without a verdict of its own (crash, killed, no result);
  the deadline came before the model ever answered;
  job: the agent's own verdict (max turns, budget, an error during its run, another 4xx such as
  a prompt too long), and a deadline reached once the agent had been answered.
"""

from __future__ import annotations

import re

from corral.domain.models import AttemptResult
from corral.domain.states import Fault, Outcome
from corral.workers.streams import StreamSummary

# How the CLIs word a credentials or model problem when no HTTP status says it (Claude Code:
# "Not logged in · Please run /login"; Codex: "Missing environment variable: `OPENAI_API_KEY`").
_AUTH = re.compile(
    r"not logged in|/login\b|unauthori[sz]ed|authenticat|api[ _-]?key"
    r"|missing environment variable|credential",
    re.IGNORECASE,
)
_MODEL = re.compile(
    r"selected model|unknown model|model[^.]{0,80}(not found|does not exist"
    r"|not exist|not supported)|model_not_found",
    re.IGNORECASE,
)
_RETRIED = frozenset({408, 409, 425, 429})  # the provider's pressure or a timeout


def command_fault(result: AttemptResult) -> Fault | None:
    """A command attempt: the shim's failures are the worker's, the command's are the job's."""
    if result.succeeded or result.outcome in (Outcome.CANCELLED, Outcome.KILLED):
        return None
    if result.outcome is Outcome.LOST:
        return Fault.WORKER
    if result.outcome is Outcome.SPAWN_ERROR:
        error = result.error or ""
        return Fault.JOB if error.startswith(("exec:", "chdir:")) else Fault.WORKER
    return Fault.JOB


def api_fault(status: int | None, message: str | None) -> Fault:
    """A model API error, by its HTTP status or, without one, its wording."""
    text = message or ""
    if status in (401, 403) or (status is None and _AUTH.search(text)):
        return Fault.CONFIG
    if status == 404 or _MODEL.search(text):
        return Fault.CONFIG
    if status is None or status >= 500 or status in _RETRIED:
        return Fault.WORKER
    return Fault.JOB  # 400, 413, 422 …: the request the job made was refused


def agent_fault(result: AttemptResult, summary: StreamSummary | None) -> Fault | None:
    """An agent attempt, from the shim's record and what the CLI's stream said."""
    if result.succeeded or result.outcome in (Outcome.CANCELLED, Outcome.KILLED):
        return None
    if result.outcome in (Outcome.LOST, Outcome.SPAWN_ERROR):  # the runner or the CLI itself
        return Fault.WORKER
    if summary is None:  # the CLI wrote nothing at all
        return Fault.WORKER
    if summary.api_failed or summary.api_retrying:
        return api_fault(summary.api_error_status, summary.error_message)
    if result.outcome is Outcome.TIMED_OUT:
        answered = summary.tokens_out > 0 or bool(summary.tool_calls)
        return Fault.JOB if answered else Fault.WORKER
    if summary.results_seen == 0:  # ended without a verdict: crashed or killed
        return Fault.WORKER
    return Fault.JOB
