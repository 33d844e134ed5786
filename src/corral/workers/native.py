"""The native helpers, `corral-shim` (shim.c: the C supervisor of one attempt, process.py) and
`corral-hook` (hook.c: what an agent CLI runs before each tool call, agents/).

An installed wheel carries both already built, in bin/ beside this module (setup.py compiles
them when the wheel is built), so a machine without a C compiler runs them as they are. A
checkout (an editable install) has no bin/: there they are built from the C sources beside
this module on first use, once per source version, into a cache.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

from corral.domain.errors import WorkerError

__all__ = ["hook_path", "native_binary", "shim_path"]

SHIPPED = Path(__file__).with_name("bin")  # where a wheel carries the built helpers
_build_lock = threading.Lock()
_built: dict[str, Path] = {}


def shim_path() -> Path:
    """The `corral-shim` binary (shim.c), built on first use."""
    return native_binary("shim")


def hook_path() -> Path:
    """The `corral-hook` binary (hook.c) agent CLIs run before each tool call."""
    return native_binary("hook")


def native_binary(name: str) -> Path:
    """Return the binary of `<name>.c` beside this module: the one the wheel carries, or one
    compiled once per source version.

    Both are named by a digest of the source, so a binary built from other source is never
    run. A compiled one lives in `$CORRAL_SHIM_DIR` (default `~/.cache/corral/`) as
    `corral-<name>-<sha256(source)[:12]>`; a build goes to a temporary name and is renamed into
    place, so concurrent builders never see (or run) a half-written file.
    """
    with _build_lock:
        if name not in _built:
            _built[name] = _build(name)
        return _built[name]


def _build(name: str) -> Path:
    source = Path(__file__).with_name(f"{name}.c").read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    shipped = SHIPPED / f"corral-{name}-{digest}"
    if os.access(shipped, os.X_OK):
        return shipped
    cache = Path(os.environ.get("CORRAL_SHIM_DIR") or Path.home() / ".cache" / "corral")
    target = cache / f"corral-{name}-{digest}"
    if os.access(target, os.X_OK):
        return target
    compiler = _find_compiler()
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    # Compile the exact bytes we hashed (from stdin), not a file that might change meanwhile.
    cmd = [*compiler, "-O2", "-Wall", "-Wextra", "-x", "c", "-o", str(tmp), "-"]
    try:
        proc = subprocess.run(cmd, input=source, capture_output=True, check=False)
        if proc.returncode != 0:
            lines = proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
            raise WorkerError(f"building corral-{name} failed: {lines[0]}")
        tmp.chmod(0o755)
        os.replace(tmp, target)
    except OSError as exc:
        raise WorkerError(f"building corral-{name} failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _find_compiler() -> list[str]:
    words = shlex.split(os.environ.get("CC", ""))
    if words and shutil.which(words[0]):
        return words
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    raise WorkerError("no C compiler found to build corral-shim: install gcc (or set CC)")
