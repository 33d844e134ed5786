"""The git a wave needs (services/epics.py): the epic branch, one worktree per task try on a
branch of its own, a try's work as a patch, and the lead's commit of that patch onto the epic
branch as Corral. Every call is `git` with an argument list (no shell), its environment free of
the caller's GIT_* variables so no outer repository or identity leaks in."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import anyio.to_thread

from corral.domain.errors import CorralError

LEAD_NAME = "Corral"
LEAD_EMAIL = "corral@localhost"
TRAILER = "Corral-Task"  # the commit trailer naming epic/task/attempt: a commit is made once
CHECK_OUTPUT = 4000  # characters of a check's output kept for people


class GitError(CorralError):
    """A git command the epic needs failed (the message has git's own words)."""

    code = "git_failed"


def _env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME=LEAD_NAME,
        GIT_AUTHOR_EMAIL=LEAD_EMAIL,
        GIT_COMMITTER_NAME=LEAD_NAME,
        GIT_COMMITTER_EMAIL=LEAD_EMAIL,
        GIT_TERMINAL_PROMPT="0",
    )
    env.update(extra)
    return env


async def git(
    cwd: Path | str, *args: str, stdin: bytes | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """Run `git args…` in `cwd`; GitError on failure when `check`."""
    done = await anyio.run_process(
        ["git", *args], cwd=str(cwd), input=stdin, env=_env(), check=False
    )
    if check and done.returncode != 0:
        words = done.stderr.decode(errors="replace").strip().splitlines()
        raise GitError(f"git {' '.join(args[:2])}: {words[-1] if words else 'failed'}")
    return done


async def text(cwd: Path | str, *args: str) -> str:
    return (await git(cwd, *args)).stdout.decode().strip()


async def toplevel(path: Path) -> Path:
    """The repository holding `path` (GitError when it is not in one)."""
    if not path.is_dir():
        raise GitError(f"{path} is not a directory")
    return Path(await text(path, "rev-parse", "--show-toplevel"))


async def commit_of(repo: Path, ref: str) -> str:
    return await text(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")


async def branch_exists(repo: Path, branch: str) -> bool:
    done = await git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
    return done.returncode == 0


async def create_branch(repo: Path, branch: str, base: str) -> None:
    await git(repo, "check-ref-format", "--branch", branch)
    await git(repo, "branch", branch, base)


_ADMIN: dict[str, anyio.Lock] = {}  # by the repository's real path


def _admin(repo: Path) -> anyio.Lock:
    """The repository's lock for worktree and branch changes: two `git worktree add`s at once
    read each other's half-made entries and fail, and a prune removes an entry being made, so
    the tries of a wave (and every epic on the same repository) take turns."""
    return _ADMIN.setdefault(os.path.realpath(repo), anyio.Lock())


async def add_worktree(repo: Path, where: Path, start: str, branch: str | None = None) -> None:
    """A worktree at `where`: on a new branch `branch` from `start`, or with no `branch` on
    the existing branch `start`; an existing worktree (a resumed wave's) is kept as it is."""
    if (where / ".git").exists():
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    target = ["-B", branch, str(where), start] if branch is not None else [str(where), start]
    async with _admin(repo):
        await git(repo, "worktree", "prune")
        await git(repo, "worktree", "add", *target)


async def remove_worktree(repo: Path, where: Path, branch: str | None = None) -> None:
    """The worktree at `where` gone, even one half made when its try was stopped (git may not
    know it), then its branch."""
    async with _admin(repo):
        await git(repo, "worktree", "remove", "--force", str(where), check=False)
        if where.exists():
            await anyio.to_thread.run_sync(partial(shutil.rmtree, where, ignore_errors=True))
            await git(repo, "worktree", "prune", check=False)
        if branch is not None:
            await git(repo, "branch", "-D", branch, check=False)


async def patch_of(worktree: Path, start: str) -> bytes:
    """Everything the try changed since `start` — its files, even ones it committed against
    the rule — as a binary patch (empty when nothing changed)."""
    await git(worktree, "add", "-A")
    return (await git(worktree, "diff", "--cached", "--binary", start)).stdout


async def committed(lead: Path, marker: str) -> str | None:
    """The epic branch's commit carrying this trailer value, if the lead made it already."""
    found = await text(lead, "log", "--format=%H", f"--grep=^{TRAILER}: {marker}$")
    return found.splitlines()[0] if found else None


async def commit_patch(lead: Path, patch: bytes, message: str, marker: str) -> str:
    """Apply `patch` on the lead's worktree (the epic branch) and commit it as Corral, once:
    a commit with the same marker already there is returned instead. GitError when the patch
    does not apply (a sibling's work this wave touched the same lines)."""
    done = await committed(lead, marker)
    if done is not None:
        return done
    if patch.strip():
        applied = await git(lead, "apply", "--index", "--3way", "-", stdin=patch, check=False)
        if applied.returncode != 0:
            await git(lead, "reset", "--hard", "HEAD", check=False)
            raise GitError("the try's work does not apply on the epic branch")
    body = f"{message}\n\n{TRAILER}: {marker}\n"
    await git(lead, "commit", "--allow-empty", "--no-verify", "-q", "-F", "-", stdin=body.encode())
    return await text(lead, "rev-parse", "HEAD")


@dataclass(frozen=True, slots=True)
class CheckResult:
    command: str
    exit_code: int
    output: str  # the tail of stdout and stderr

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


async def run_checks(worktree: Path, checks: Sequence[str], timeout_s: float) -> list[CheckResult]:
    """Run the task's checks (operator-written shell commands from the epic file) in the
    worktree, in order, stopping at the first that fails."""
    out: list[CheckResult] = []
    for command in checks:
        with anyio.move_on_after(timeout_s) as scope:
            done = await anyio.run_process(
                ["/bin/sh", "-c", command],
                cwd=str(worktree),
                env=_env(),
                check=False,
                stderr=subprocess.STDOUT,
            )
        if scope.cancelled_caught:
            out.append(CheckResult(command, 124, f"timed out after {timeout_s:g}s"))
            break
        tail = done.stdout.decode(errors="replace")[-CHECK_OUTPUT:]
        out.append(CheckResult(command, done.returncode, tail))
        if done.returncode != 0:
            break
    return out
