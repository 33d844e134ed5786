"""Programs that run another command: ``sh -c``, ``env``, ``xargs``, ``find -exec``, ``timeout`` …

`policy.shell` hands every simple command whose program is in `WRAPPERS` to its handler, which
reads the program's options (parsed, never grepped) and continues with the command it runs, or
reports a problem when it cannot tell. A shell wrapper (``bash -c``, ``eval``) is itself a
command the role must be allowed to run, and its script is checked as commands of its own; the
other wrappers are transparent (``timeout 5 kubectl get pods`` is checked as ``kubectl get
pods``). Privilege changes (``sudo``, ``su``, ``doas``, ``pkexec`` …) are refused outright;
``nohup`` and ``setsid`` mark what they run as detached from the attempt, which a scope must
allow explicitly (docs/explanation/governance.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["WRAPPERS", "Ctx", "Opts", "Walker", "dangerous_env", "skip_options", "wrapper_name"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYSTEM_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"})

# Environment variables that change which code a command runs (or how the shell runs it).
_DANGEROUS_ENV = frozenset(
    {
        "PATH", "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
        "CDPATH", "GLOBIGNORE", "PAGER", "EDITOR", "VISUAL", "MANPAGER", "LESSOPEN",
        "LESSCLOSE", "BROWSER", "KUBE_EDITOR", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB",
        "RUBYOPT", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "SSH_ASKPASS",
        "SUDO_ASKPASS", "GCONV_PATH", "HOSTALIASES",
    }
)  # fmt: skip
_DANGEROUS_ENV_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "GIT_", "PYTHON", "NODE_")


def dangerous_env(name: str) -> bool:
    """Whether setting ``name`` can change which program (or code) runs."""
    return name in _DANGEROUS_ENV or name.startswith(_DANGEROUS_ENV_PREFIXES)


@dataclass(frozen=True, slots=True)
class Ctx:
    """How a command was reached: the wrappers peeled so far, and what they may inject."""

    wrappers: tuple[str, ...]
    placeholder: str | None = None  # text replaced at run time (xargs -I, find's {})
    appended: bool = False  # unknown words are appended at run time (xargs, find -exec … +)
    detached: bool = False  # runs in the background or in a session of its own

    def wrap(self, label: str, placeholder: str | None = None, appended: bool = False) -> Ctx:
        return Ctx(
            (*self.wrappers, label),
            placeholder or self.placeholder,
            appended or self.appended,
            self.detached,
        )

    def detach(self) -> Ctx:
        """The same, run in the background or in a session of its own."""
        return Ctx(self.wrappers, self.placeholder, self.appended, True)


class Walker(Protocol):
    """What a handler may do with the command it was given (`policy.shell`'s walker)."""

    def problem(self, message: str) -> None: ...

    def add(self, argv: list[str], ctx: Ctx) -> None: ...

    def emit(self, argv: list[str], ctx: Ctx) -> None: ...

    def wrapped(self, argv: list[str], start: int, ctx: Ctx, label: str) -> None: ...

    def nested(self, code: str, ctx: Ctx, label: str, dialect: str | None = None) -> None: ...

    def hold(self, reason: str, message: str) -> None: ...


Handler = Callable[[Walker, list[str], Ctx], None]


@dataclass(frozen=True, slots=True)
class Opts:
    """An option grammar: which short/long options take a value, which make it not a wrapper."""

    flags: str = ""
    valued: str = ""
    long_flags: frozenset[str] = frozenset()
    long_valued: frozenset[str] = frozenset()
    plain: str = ""  # short options that mean "this is not running a command"
    operands: int = 0  # words between the options and the command (timeout's DURATION)


def skip_options(argv: list[str], opts: Opts) -> tuple[int, set[str]] | str:
    """Index of the first operand and the options seen, or an error message."""
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return i + 1, seen
        if arg.startswith("--"):
            key = arg.split("=", 1)[0]
            if key in opts.long_flags and "=" not in arg:
                i += 1
            elif key in opts.long_valued:
                i += 1 if "=" in arg else 2
            else:
                return f"unsupported option `{arg}`"
            seen.add(key)
            continue
        if not arg.startswith("-") or arg == "-":
            return i, seen
        for j, ch in enumerate(arg[1:], start=1):
            seen.add(ch)
            if ch in opts.valued:
                i += 1 if j + 1 < len(arg) else 2
                break
            if ch not in opts.flags and ch not in opts.plain:
                return f"unsupported option `{arg}`"
        else:
            i += 1
    return i, seen


def _simple_wrapper(label: str, opts: Opts, detaches: bool = False) -> Handler:
    def handle(walker: Walker, argv: list[str], ctx: Ctx) -> None:
        result = skip_options(argv, opts)
        if isinstance(result, str):
            walker.problem(f"`{argv[0]}`: {result}")
            return
        start, seen = result
        if any(ch in seen for ch in opts.plain):
            walker.add(argv, ctx)  # e.g. `command -v x`: runs nothing
            return
        if label == "exec" and start >= len(argv) and not ctx.appended:
            return  # `exec 2>&1`: only redirections
        walker.wrapped(argv, start + opts.operands, ctx.detach() if detaches else ctx, label)

    return handle


def _nice(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    if len(argv) > 1 and re.fullmatch(r"-[0-9]+", argv[1]):
        walker.wrapped(argv, 2, ctx, "nice")
    else:
        _NICE(walker, argv, ctx)


_NICE = _simple_wrapper("nice", Opts(valued="n", long_valued=frozenset({"--adjustment"})))

_SHELL_O = frozenset({"pipefail", "errexit", "nounset", "xtrace"})
# The shells whose `-c` script the checker reads, and as which dialect (policy/shell.py)
SHELL_DIALECTS = {"bash": "bash", "sh": "sh", "dash": "sh", "ash": "sh"}
_UNMODELLED_SHELLS = frozenset({"zsh", "ksh", "mksh", "fish", "csh", "tcsh", "yash", "busybox"})


def _shell(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    """``bash -c 'script'``: the script is checked as commands, and the shell itself is a
    command the role must be allowed to run."""
    base = wrapper_name(argv[0]) or argv[0]
    dialect = SHELL_DIALECTS.get(base)
    if dialect is None:
        walker.problem(f"`{base}` is a shell Corral does not model; use bash or sh")
        return
    has_c, i = False, 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        takes_o = arg.endswith("o")  # `-o pipefail`, `-euo pipefail`
        flags = arg[1:-1] if takes_o else arg[1:]
        if not set(flags) <= set("ceuxvl") or (
            takes_o and (i + 1 >= len(argv) or argv[i + 1] not in _SHELL_O)
        ):
            walker.problem(f"`{base} {arg}` is not supported; only `{base} -c '…'` is")
            return
        has_c = has_c or "c" in flags
        i += 2 if takes_o else 1
    if not has_c or i >= len(argv):
        walker.problem(f"`{base}` reading a script or stdin cannot be checked; use `{base} -c`")
        return
    walker.nested(argv[i], ctx, f"{base} -c", dialect)
    walker.add(argv, ctx)


def _eval(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    start = 2 if len(argv) > 1 and argv[1] == "--" else 1
    if ctx.appended:
        walker.problem("`eval` with words appended at run time cannot be checked")
        return
    if start < len(argv):
        walker.nested(" ".join(argv[start:]), ctx, "eval")
    walker.add(argv, ctx)


def _env(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    opts = Opts(
        flags="i0",
        valued="uC",
        long_flags=frozenset({"--ignore-environment", "--null"}),
        long_valued=frozenset({"--unset", "--chdir"}),
    )
    result = skip_options(argv, opts)
    if isinstance(result, str):
        walker.problem(f"`env`: {result}")
        return
    i = result[0]
    while i < len(argv) and "=" in argv[i] and NAME.match(argv[i].split("=", 1)[0]):
        name = argv[i].split("=", 1)[0]
        if dangerous_env(name):
            walker.problem(f"setting `{name}` can change which program runs, so it is not allowed")
        i += 1
    if i >= len(argv) and not ctx.appended:
        walker.add(argv, ctx)  # plain `env`: prints the environment
    else:
        walker.wrapped(argv, i, ctx, "env")


_XARGS_OPTS = Opts(
    flags="0rtpxo",
    valued="adEILnPs",
    long_flags=frozenset(
        {"--null", "--no-run-if-empty", "--verbose", "--interactive", "--exit", "--open-tty"}
    ),
    long_valued=frozenset(
        {"--arg-file", "--delimiter", "--max-args", "--max-procs", "--max-chars",
         "--process-slot-var"}
    ),
)  # fmt: skip


def _xargs(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    """``xargs [opts] [cmd [args]]``: the command runs with input words appended (or put in)."""
    placeholder: str | None = None
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        key = arg.split("=", 1)[0]
        i += 1
        if arg == "--":
            break
        if key in ("--replace", "-i") or (arg.startswith("-i") and not arg.startswith("--")):
            placeholder = arg.split("=", 1)[1] if "=" in arg else arg[2:]  # optional value
            placeholder = placeholder or "{}"
        elif arg.startswith(("-e", "-l", "--eof", "--max-lines")):
            pass  # optional value, attached if present
        elif arg.startswith("-I"):
            placeholder = arg[2:] or (argv[i] if i < len(argv) else None)
            i += 0 if arg[2:] else 1
        else:
            result = skip_options(["xargs", arg, *argv[i : i + 1]], _XARGS_OPTS)
            if isinstance(result, str):
                walker.problem(f"`xargs`: {result}")
                return
            i += result[0] - 2  # 1 more if the option took the next word as its value
    inner = argv[i:] if i < len(argv) else ["echo"]
    walker.emit(inner, ctx.wrap("xargs", placeholder, appended=True))


_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    walker.add(argv, ctx)
    i = 1
    while i < len(argv):
        if argv[i] not in _FIND_EXEC:
            i += 1
            continue
        action, j = argv[i], i + 1
        while j < len(argv) and not (argv[j] == ";" or (argv[j] == "+" and argv[j - 1] == "{}")):
            j += 1
        if j >= len(argv):
            walker.problem(f"`find {action}` without a terminating `;` or `+`")
            return
        if j == i + 1:
            walker.problem(f"`find {action}` without a command")
            return
        plus = argv[j] == "+"
        label = f"find {action} +" if plus else f"find {action}"
        walker.emit(argv[i + 1 : j], ctx.wrap(label, "{}", appended=plus))
        i = j + 1


def _privileged(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    name = wrapper_name(argv[0]) or argv[0]
    walker.problem(f"`{name}` changes privileges; Corral does not run a command as another user")


def _watch(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    opts = Opts(
        flags="bcdegtxpwrC",
        valued="nq",
        long_flags=frozenset(
            {"--beep", "--color", "--differences", "--errexit", "--chgexit", "--no-title",
             "--exec", "--precise", "--no-wrap", "--no-linewrap", "--no-rerun"}
        ),
        long_valued=frozenset({"--interval"}),
    )  # fmt: skip
    result = skip_options(argv, opts)
    if isinstance(result, str):
        walker.problem(f"`watch`: {result}")
        return
    start, seen = result
    if "x" in seen or "--exec" in seen:
        walker.wrapped(argv, start, ctx, "watch")
    elif ctx.appended:
        walker.problem("`watch` with words appended at run time cannot be checked")
    elif start >= len(argv):
        walker.problem("`watch` without a command")
    else:
        walker.nested(" ".join(argv[start:]), ctx, "watch", "sh")  # watch runs `sh -c`


def _flock(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    opts = Opts(
        flags="sxenuoF",
        valued="wE",
        long_flags=frozenset(
            {"--shared", "--exclusive", "--nonblock", "--nb", "--unlock", "--close",
             "--no-fork", "--verbose"}
        ),
        long_valued=frozenset({"--timeout", "--wait", "--conflict-exit-code"}),
    )  # fmt: skip
    result = skip_options(argv, opts)
    if isinstance(result, str):
        walker.problem(f"`flock`: {result}")
        return
    lock = result[0]
    if lock + 1 < len(argv) and argv[lock + 1] in ("-c", "--command"):
        if lock + 2 >= len(argv):
            walker.problem("`flock -c` without a command")
        else:
            walker.nested(argv[lock + 2], ctx, "flock -c", "sh")  # flock runs `sh -c`
    elif lock + 1 >= len(argv) and not ctx.appended:
        walker.add(argv, ctx)  # `flock FD`: locks a descriptor, runs nothing
    else:
        walker.wrapped(argv, lock + 1, ctx, "flock")


def _coproc(walker: Walker, argv: list[str], ctx: Ctx) -> None:
    walker.problem("`coproc` is not supported")


PRIVILEGED = frozenset({"sudo", "su", "doas", "pkexec", "run0", "chroot", "sg", "setpriv", "capsh"})
SHELLS = frozenset(SHELL_DIALECTS) | _UNMODELLED_SHELLS

WRAPPERS: dict[str, Handler] = {
    **dict.fromkeys(SHELLS, _shell),
    **dict.fromkeys(PRIVILEGED, _privileged),
    "eval": _eval,
    "env": _env,
    "xargs": _xargs,
    "find": _find,
    "watch": _watch,
    "flock": _flock,
    "nice": _nice,
    "coproc": _coproc,
    "nohup": _simple_wrapper("nohup", Opts(), detaches=True),
    "setsid": _simple_wrapper(
        "setsid", Opts(flags="cfw", long_flags=frozenset({"--ctty", "--fork", "--wait"})),
        detaches=True),
    "builtin": _simple_wrapper("builtin", Opts()),
    "unbuffer": _simple_wrapper("unbuffer", Opts(flags="p")),
    "exec": _simple_wrapper("exec", Opts(flags="cl", valued="a")),
    "command": _simple_wrapper("command", Opts(flags="p", plain="vV")),
    "stdbuf": _simple_wrapper(
        "stdbuf", Opts(valued="ioe", long_valued=frozenset({"--input", "--output", "--error"}))
    ),
    "timeout": _simple_wrapper(
        "timeout",
        Opts(
            flags="v",
            valued="sk",
            long_flags=frozenset({"--preserve-status", "--foreground", "--verbose"}),
            long_valued=frozenset({"--signal", "--kill-after"}),
            operands=1,
        ),
    ),
    "time": _simple_wrapper(
        "time",
        Opts(
            flags="pavq",
            valued="fo",
            long_flags=frozenset({"--append", "--verbose", "--portability", "--quiet"}),
            long_valued=frozenset({"--format", "--output"}),
        ),
    ),
    "ionice": _simple_wrapper(
        "ionice",
        Opts(
            flags="t",
            valued="cn",
            plain="pPu",
            long_flags=frozenset({"--ignore"}),
            long_valued=frozenset({"--class", "--classdata"}),
        ),
    ),
    "taskset": _simple_wrapper(
        "taskset",
        Opts(flags="ac", plain="p", long_flags=frozenset({"--all-tasks", "--cpu-list"}),
             operands=1),
    ),
}  # fmt: skip


def wrapper_name(name: str) -> str | None:
    """The wrapper a command name refers to: bare names and system paths only, not ./timeout."""
    if "/" not in name:
        return name
    directory, _, base = name.rpartition("/")
    return base if directory in _SYSTEM_DIRS else None
