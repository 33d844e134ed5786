"""The rule-based extractor (the default; runtime/flywheel.py loads another when configured):
what a finished run's trace says, as candidate learnings. Deterministic: the same trace gives
the same candidates.

- the final summary's sentences that carry the seed's signal phrases: "fixed by",
  "resolved by", "workaround:" → solution; "decided to", "opted for", "going with" → decision;
  "learned that", "key takeaway", "important to note" → learning; "didn't work", "failed
  because", "mistake was" → failure; "see also", a URL → reference;
- each tool call Corral denied (tool and reason, once each) → failure;
- each attempt's error → failure;
- a check (a shell command that runs tests, a linter or a type checker) that failed: when the
  same command later passed, a solution naming the files changed in between; when it never
  passed, a failure.

Write-on-success (`gate`): a run that succeeded keeps every candidate; one that failed keeps
only its failures; any other end writes nothing."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from corral.domain.agents import AgentEvent, ToolCallTrace
from corral.domain.knowledge import Candidate, LearningKind

MAX_BODY = 1200
MAX_TITLE = 120

_SIGNALS: tuple[tuple[LearningKind, re.Pattern[str]], ...] = (
    (
        LearningKind.SOLUTION,
        re.compile(r"fixed by|the fix (?:is|was)|resolved by|workaround:|solved by", re.I),
    ),
    (
        LearningKind.DECISION,
        re.compile(r"decided to|we chose|i chose|going with|opted for|\*\*decision:\*\*", re.I),
    ),
    (
        LearningKind.FAILURE,
        re.compile(r"didn't work|did not work|failed because|mistake was|anti-pattern", re.I),
    ),
    (
        LearningKind.LEARNING,
        re.compile(r"learned that|\btil\b|key takeaway|important to note|turns out", re.I),
    ),
    (LearningKind.REFERENCE, re.compile(r"see also|https?://\S+", re.I)),
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_CHECK = re.compile(
    r"\b(?:pytest|unittest|tox|nox|ruff|mypy|pyright|flake8|pylint|black|eslint|tsc|jest|vitest"
    r"|cargo\s+(?:test|check|clippy)|go\s+(?:test|vet)|npm\s+(?:test|run)|yarn\s+test"
    r"|pnpm\s+test|make\s+(?:test|check|lint)|lint-imports|test)\b"
)
_FAILED = re.compile(
    r"\bFAILED\b|\bFAIL\b|\b[1-9]\d* failed\b|\berror:|\bErrors? found\b|Traceback \(most recent"
    r"|exit (?:code|status) [1-9]|\bfailed\b",
    re.I,
)
_SHELL_TOOLS = frozenset({"bash", "shell", "exec_command", "local_shell", "run_shell_command"})
_EDIT_TOOLS = frozenset({"edit", "write", "multiedit", "apply_patch", "notebookedit", "patch"})


@dataclass(frozen=True, slots=True)
class RunTrace:
    """What the extractor reads of a finished run."""

    job_id: str
    role: str
    prompt: str
    state: str  # the job's final state
    events: Sequence[AgentEvent]  # one per attempt, in order

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"


Extractor = Callable[[RunTrace], list[Candidate]]


def _one_line(text: str, limit: int = MAX_TITLE) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _clip(text: str, limit: int = MAX_BODY) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def command_of(call: ToolCallTrace) -> str | None:
    """The shell command of a shell tool call, or None."""
    if call.tool.lower() not in _SHELL_TOOLS:
        return None
    value: Any = call.input.get("command", call.input.get("cmd"))
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    return value.strip() if isinstance(value, str) and value.strip() else None


def _edited(call: ToolCallTrace) -> str | None:
    if call.tool.lower() not in _EDIT_TOOLS:
        return None
    for key in ("file_path", "path", "filePath", "notebook_path"):
        value = call.input.get(key)
        if isinstance(value, str) and value:
            return value
    return call.tool


def _first_failure_line(output: str) -> str:
    for line in output.splitlines():
        if _FAILED.search(line):
            return _one_line(line, 200)
    return _one_line(output, 200)


def from_summary(text: str) -> list[Candidate]:
    found: list[Candidate] = []
    seen: set[tuple[LearningKind, str]] = set()
    for sentence in (s.strip() for s in _SENTENCE.split(text)):
        if len(sentence) < 12:
            continue
        for kind, pattern in _SIGNALS:
            if pattern.search(sentence) and (kind, sentence) not in seen:
                seen.add((kind, sentence))
                found.append(
                    Candidate(
                        kind=kind,
                        title=_one_line(sentence),
                        body=_clip(f"{sentence}\n\n**Source**: the final summary of the run."),
                        confidence="medium",
                    )
                )
                break
    return found


def from_denials(calls: Sequence[ToolCallTrace], role: str) -> list[Candidate]:
    found: list[Candidate] = []
    seen: set[tuple[str, str]] = set()
    for call in calls:
        if not call.denied:
            continue
        reason = call.reason or "denied"
        if (call.tool, reason) in seen:
            continue
        seen.add((call.tool, reason))
        what = command_of(call)
        body = (
            f"Corral denied the tool call `{call.tool}`"
            + (f" running `{_one_line(what, 200)}`" if what else "")
            + f" for role {role}: {_one_line(reason, 300)}.\n"
            "- Avoid this call: it is refused by the role's scope or a guardrail; use a tool "
            "the role allows instead.\n\n**Source**: Corral's governance decision on the call."
        )
        found.append(
            Candidate(
                kind=LearningKind.FAILURE,
                title=_one_line(f"`{call.tool}` is denied: {reason}"),
                body=_clip(body),
                confidence="high",
            )
        )
    return found


def from_checks(calls: Sequence[ToolCallTrace]) -> list[Candidate]:
    """Checks that failed, and what made them pass."""
    found: list[Candidate] = []
    open_failures: dict[str, tuple[str, list[str]]] = {}  # command → (failure line, edits since)
    for call in calls:
        if call.denied:
            continue
        if (path := _edited(call)) is not None:
            for _, edits in open_failures.values():
                if path not in edits:
                    edits.append(path)
            continue
        cmd = command_of(call)
        if cmd is None or not _CHECK.search(cmd):
            continue
        failed = bool(_FAILED.search(call.output or ""))
        if failed:
            if cmd not in open_failures:
                open_failures[cmd] = (_first_failure_line(call.output or ""), [])
            continue
        if cmd in open_failures:
            line, edits = open_failures.pop(cmd)
            changed = ", ".join(f"`{e}`" for e in edits[:8]) or "no file edits (a retry)"
            body = (
                f"The check `{_one_line(cmd, 200)}` failed with:\n```\n{line}\n```\n"
                f"It passed after changes to {changed}.\n"
                f"- When `{_one_line(cmd, 80)}` fails like this, check those files first.\n\n"
                "**Source**: the run's tool calls (a failed check, then the same check passing)."
            )
            found.append(
                Candidate(
                    kind=LearningKind.SOLUTION,
                    title=_one_line(f"`{cmd}` failing ({line}) was fixed"),
                    body=_clip(body),
                    confidence="high",
                )
            )
    for cmd, (line, _) in open_failures.items():
        body = (
            f"The check `{_one_line(cmd, 200)}` failed and never passed in this run:\n"
            f"```\n{line}\n```\n\n**Source**: the run's tool calls."
        )
        found.append(
            Candidate(
                kind=LearningKind.FAILURE,
                title=_one_line(f"`{cmd}` kept failing: {line}"),
                body=_clip(body),
                confidence="medium",
            )
        )
    return found


def from_errors(events: Sequence[AgentEvent]) -> list[Candidate]:
    found: list[Candidate] = []
    seen: set[str] = set()
    for e in events:
        if not e.error or e.error in seen:
            continue
        seen.add(e.error)
        body = (
            f"Attempt {e.attempt} ended with an error: {_clip(e.error, 600)}\n\n"
            "**Source**: the attempt's trace."
        )
        found.append(
            Candidate(
                kind=LearningKind.FAILURE,
                title=_one_line(f"Attempt failed: {e.error}"),
                body=_clip(body),
                confidence="medium",
            )
        )
    return found


def rules(trace: RunTrace) -> list[Candidate]:
    """The rule-based extractor."""
    calls = [c for e in trace.events for c in e.tool_calls]
    found: list[Candidate] = []
    last = trace.events[-1] if trace.events else None
    if last is not None and last.final_text:
        found += from_summary(last.final_text)
    found += from_checks(calls)
    found += from_denials(calls, trace.role)
    found += from_errors(trace.events)
    return found


FAILED_STATES = ("FAILED", "TIMED_OUT", "DEAD_LETTERED")


def writes_anything(state: str) -> bool:
    """Whether a run that ended in `state` may write learnings at all (see `gate`)."""
    return state == "SUCCEEDED" or state in FAILED_STATES


def gate(trace: RunTrace, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Write-on-success: all of a succeeded run's candidates, a failed run's failures only."""
    if trace.succeeded:
        return list(candidates)
    if trace.state in FAILED_STATES:
        return [c for c in candidates if c.kind is LearningKind.FAILURE]
    return []
