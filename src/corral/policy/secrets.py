"""Which parts of a submission are secret: what the store may keep, and what must be sealed.

A job's command, environment and prompt are stored redacted (`conceal`): the values of the
variables it marks secret (`--secret-env NAME` with `--setenv NAME=…`) or whose names say they
hold one (`API_TOKEN`, `DB_PASSWORD` …), and every credential the redactor's shapes find. The
real text of what changed is sealed (workers/sealing.py) into the job's options (`sealed`),
and an attempt gets it back at spawn (`reveal`); every secret found is then redacted from that
attempt's output and traces (`secret_values`). Pure functions: no key, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.policy.redact import MARK, SECRET_NAME, Redactor


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """The parts of a job that may hold secrets."""

    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    prompt: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Concealed:
    stored: Parts  # what the store keeps and every view shows
    hidden: dict[str, Any]  # the real values of what changed ({} when nothing did)


def secret_keys(env: Mapping[str, str], marked: Iterable[str]) -> set[str]:
    """The variables whose whole value is secret: marked, or named like a secret."""
    marks = set(marked)
    return {k for k in env if k in marks or SECRET_NAME.search(k)}


def _declared(parts: Parts, marked: Iterable[str]) -> Redactor:
    return Redactor(parts.env[k] for k in secret_keys(parts.env, marked))


def conceal(parts: Parts, marked: Iterable[str] = ()) -> Concealed:
    """What may be stored of `parts`, and the real values to seal."""
    marked = tuple(marked)
    keys = secret_keys(parts.env, marked)
    r = _declared(parts, marked)
    command = tuple(r.text(a) for a in parts.command)
    env = {k: (MARK if k in keys and v else r.text(v)) for k, v in parts.env.items()}
    prompt = r.text(parts.prompt) if parts.prompt is not None else None
    hidden: dict[str, Any] = {}
    if command != parts.command:
        hidden["command"] = list(parts.command)
    changed = {k: v for k, v in parts.env.items() if env[k] != v}
    if changed:
        hidden["env"] = changed
    if prompt != parts.prompt:
        hidden["prompt"] = parts.prompt
    return Concealed(stored=Parts(command=command, env=env, prompt=prompt), hidden=hidden)


def reveal(stored: Parts, hidden: Mapping[str, Any]) -> Parts:
    """The real parts: the stored ones with the sealed values put back."""
    command = hidden.get("command")
    env = hidden.get("env") or {}
    return Parts(
        command=tuple(str(a) for a in command) if isinstance(command, list) else stored.command,
        env={**stored.env, **{str(k): str(v) for k, v in dict(env).items()}},
        prompt=str(hidden["prompt"]) if "prompt" in hidden else stored.prompt,
    )


def secret_values(parts: Parts, marked: Iterable[str] = ()) -> list[str]:
    """Every secret the real parts hold: the declared values and what the shapes find."""
    marked = tuple(marked)
    r = _declared(parts, marked)
    found = list(r.values)
    for text in (*parts.command, *parts.env.values(), parts.prompt or ""):
        found += r.found(text)
    return list(dict.fromkeys(found))
