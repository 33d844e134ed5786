"""Build hook: compile the two native helpers into the wheel.

`corral-shim` (the supervisor of one attempt) and `corral-hook` (what an agent CLI runs before
each tool call) are small C programs. A wheel carries them already built, under
corral/workers/bin/, named by a digest of their source so the package finds exactly the
binary of the source it ships (corral/workers/native.py). Building the wheel (or installing
from the sdist) needs a C compiler; installing the wheel does not. Everything else about the
package is declared in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HELPERS = ("shim", "hook")
SOURCES = Path(__file__).parent / "src" / "corral" / "workers"


def _compiler() -> list[str]:
    words = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "")
    if words and shutil.which(words[0]):
        return words[:1]  # the interpreter's CC may carry flags of its own build: not ours
    for name in ("cc", "gcc", "clang"):
        if found := shutil.which(name):
            return [found]
    raise SystemExit("building corral needs a C compiler for corral-shim and corral-hook")


class BuildWithHelpers(build_py):
    """build_py, then the helpers compiled into the build tree's corral/workers/bin/."""

    def run(self) -> None:
        super().run()
        out = Path(self.build_lib) / "corral" / "workers" / "bin"
        out.mkdir(parents=True, exist_ok=True)
        for name in HELPERS:
            source = (SOURCES / f"{name}.c").read_bytes()
            digest = hashlib.sha256(source).hexdigest()[:12]
            target = out / f"corral-{name}-{digest}"
            cmd = [*_compiler(), "-O2", "-Wall", "-Wextra", "-x", "c", "-o", str(target), "-"]
            self.announce(f"compiling corral-{name}: {' '.join(cmd)}", level=2)
            subprocess.run(cmd, input=source, check=True)
            target.chmod(0o755)


class BinaryDistribution(Distribution):
    """The wheel holds native executables: tag it for the platform, not `any`."""

    def has_ext_modules(self) -> bool:
        return True


try:  # setuptools >= 70.1 ships bdist_wheel; older ones take it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    """Executables, no extension modules: any Python 3, one platform (py3-none-<platform>)."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildWithHelpers, "bdist_wheel": PlatformWheel},
)
