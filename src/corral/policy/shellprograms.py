"""Programs that take a command and run it elsewhere: on a Ray cluster, in a pod, on a host.

``ray job submit -- <entrypoint>`` runs the entrypoint through ``/bin/sh`` on the cluster,
``ray exec CONFIG 'cmd'`` on its head node, ``ssh host cmd`` through the remote shell, and
``kubectl exec|run|debug … -- cmd`` in a container. The command they carry is checked as a
command of its own (parsed as POSIX sh where a shell runs it), and the outer command is checked
too: the role must be allowed both. Options that install code on the cluster (a runtime
environment with packages, a working directory from a URL) need a human's approval: they are
reported as *holds* (docs/explanation/governance.md).
"""

from __future__ import annotations

import json
from typing import Any

from corral.policy.shellwrap import Ctx, Handler, Opts, Walker, dangerous_env, skip_options

__all__ = ["PROGRAMS"]

_RAY_SUBMIT_VALUED = frozenset(
    {"--address", "--job-id", "--submission-id", "--runtime-env", "--runtime-env-json",
     "--working-dir", "--metadata-json", "--entrypoint-num-cpus", "--entrypoint-num-gpus",
     "--entrypoint-memory", "--entrypoint-resources", "--entrypoint-label-selector",
     "--headers", "--log-style", "--log-color", "--verify"}
)  # fmt: skip
_RAY_SUBMIT_FLAGS = frozenset({"--no-wait", "-v", "--verbose", "-h", "--help"})
# Runtime-environment fields that only configure: anything else installs or fetches code
_RUNTIME_ENV_PLAIN = frozenset({"env_vars", "config", "excludes", "working_dir", "py_modules"})


def _ray(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    if argv[1:3] == ["job", "submit"]:
        _ray_job_submit(walker, argv, ctx)
    elif argv[1:2] == ["exec"]:
        _ray_exec(walker, argv, ctx)
    else:
        walker.add(argv, ctx)


def _ray_job_submit(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    """``ray job submit [options] [--] ENTRYPOINT…``: the entrypoint words, joined by spaces,
    run through ``/bin/sh`` on the cluster."""
    i, options, entry = 3, [], []
    while i < len(argv):
        word = argv[i]
        if word == "--":
            entry = argv[i + 1 :]
            break
        name, eq, value = word.partition("=")
        if name in _RAY_SUBMIT_VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    walker.problem(f"`ray job submit {name}` without a value")
                    return
                value = argv[i + 1]
                i += 1
            options.append((name, value))
        elif word in _RAY_SUBMIT_FLAGS:
            options.append((word, ""))
        elif word.startswith("-"):
            walker.problem(f"`ray job submit`: unsupported option `{word}`")
            return
        else:  # the entrypoint without `--`: click would still read options after it
            entry = argv[i:]
            if any(w.split("=", 1)[0] in _RAY_SUBMIT_VALUED | _RAY_SUBMIT_FLAGS for w in entry):
                walker.problem(
                    "`ray job submit`: an option after the entrypoint is ambiguous; "
                    "put the entrypoint after `--`"
                )
                return
            break
        i += 1
    if not entry:
        walker.problem("`ray job submit` without an entrypoint")
        return
    for name, value in options:
        _ray_option_hold(walker, name, value)
    walker.nested(" ".join(entry), ctx, "ray job submit", "sh")
    walker.add(argv, ctx)


def _ray_option_hold(walker: Walker, name: str, value: str) -> None:
    if name == "--runtime-env":
        walker.hold(
            "installs_code",
            f"the runtime environment comes from the file `{value}`, "
            "which cannot be checked: a human approves it",
        )
    elif name == "--working-dir" and "://" in value:
        walker.hold("installs_code", f"the working directory is fetched from `{value}`")
    elif name == "--runtime-env-json":
        why = _runtime_env_installs(value)
        if why is not None:
            walker.hold("installs_code", f"--runtime-env-json {why}")


def _runtime_env_installs(text: str) -> str | None:
    """Why a runtime environment (JSON) needs approval, or None when it only configures."""
    try:
        env: Any = json.loads(text)
    except ValueError:
        return "is not JSON Corral can read"
    if not isinstance(env, dict):
        return "is not a JSON object"
    for key, value in env.items():
        if key not in _RUNTIME_ENV_PLAIN:
            return f"installs or fetches code (`{key}`)"
        if key in ("working_dir", "py_modules") and "://" in json.dumps(value):
            return f"fetches `{key}` from a URL"
        if key == "env_vars" and (
            not isinstance(value, dict) or any(dangerous_env(str(k)) for k in value)
        ):
            return "sets variables that change which code runs"
    return None


_RAY_EXEC = Opts(
    long_flags=frozenset(
        {"--stop", "--start", "--no-config-cache", "--disable-usage-stats", "--screen", "--tmux"}
    ),
    long_valued=frozenset({"--run-env", "--cluster-name", "--port-forward", "--extra-screen-args"}),
    valued="np",
)


def _ray_exec(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    """``ray exec [options] CLUSTER_CONFIG CMD``: CMD runs through a shell on the head node."""
    result = skip_options(["ray", *argv[2:]], _RAY_EXEC)
    if isinstance(result, str):
        walker.problem(f"`ray exec`: {result}")
        return
    start, seen = result
    rest = argv[start + 1 :]
    if len(rest) != 2:
        walker.problem("`ray exec` needs exactly the cluster config and one command string")
        return
    detached = bool(seen & {"--screen", "--tmux"})
    walker.nested(rest[1], ctx.detach() if detached else ctx, "ray exec", "sh")
    walker.add(argv, ctx)


_KUBECTL_GLOBAL_VALUED = frozenset(
    {"-n", "--namespace", "--context", "--kubeconfig", "--cluster", "--user", "-s", "--server",
     "--as", "--as-group", "--as-uid", "--token", "--request-timeout", "--cache-dir", "-v",
     "--v", "--vmodule", "--log-file", "--profile", "--profile-output", "--username",
     "--password", "--certificate-authority", "--client-certificate", "--client-key",
     "--tls-server-name"}
)  # fmt: skip
_KUBECTL_RUNS = frozenset({"exec", "run", "debug"})


def _kubectl(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    """``kubectl exec|run|debug … -- CMD ARGS``: CMD runs in a container (exec'd, no shell)."""
    sub, i = None, 1
    while i < len(argv) and sub is None:
        word = argv[i]
        if word in _KUBECTL_GLOBAL_VALUED:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            sub = word
    walker.add(argv, ctx)
    if sub in _KUBECTL_RUNS and "--" in argv:
        inner = argv[argv.index("--") + 1 :]
        if inner:
            walker.emit(inner, ctx.wrap(f"kubectl {sub}"))


_SSH = Opts(flags="46AaCfGgKkMNnqsTtVvXxYy", valued="BbcDEeFIiJLlmOoPpQRSWw")
_SSH_COMMAND_OPTIONS = (
    "proxycommand",
    "localcommand",
    "permitlocalcommand",
    "knownhostscommand",
    "remotecommand",
    "proxyusefdpass",
)


def _ssh(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    """``ssh [options] HOST [CMD…]``: CMD, joined by spaces, runs through the remote shell."""
    result = skip_options(argv, _SSH)
    if isinstance(result, str):
        walker.problem(f"`ssh`: {result}")
        return
    start, seen = result
    if "F" in seen:
        walker.problem("`ssh -F`: a configuration file may run commands; it cannot be checked")
        return
    for k, word in enumerate(argv[1:start], start=1):
        value = (
            word[2:]
            if word.startswith("-o") and len(word) > 2
            else (argv[k + 1] if word == "-o" and k + 1 < len(argv) else "")
        )
        if value.lower().replace(" ", "").startswith(_SSH_COMMAND_OPTIONS):
            walker.problem(f"`ssh -o {value}` runs a command that cannot be checked")
            return
    if start >= len(argv):
        walker.problem("`ssh` without a host")
        return
    host, command = argv[start], argv[start + 1 :]
    if command:
        walker.nested(" ".join(command), ctx.detach() if "f" in seen else ctx, f"ssh {host}", "sh")
    elif not seen & {"N", "s"}:
        walker.problem("an interactive `ssh` session cannot be checked; give the command")
    walker.add(argv, ctx)


PROGRAMS: dict[str, Handler] = {"ray": _ray, "kubectl": _kubectl, "ssh": _ssh}
