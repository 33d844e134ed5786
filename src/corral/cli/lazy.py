"""Commands whose module is imported when they are used: `corral jobs` loads the job commands,
not the governance, guardrail, policy and world ones (and what they import). `corral --help`
and completion still see every command: listing names costs nothing, and help loads them all
to print their one-line summaries.

Their options are converted without pydantic where typer's conversion cannot differ (`light`):
typer builds a pydantic TypeAdapter for each option it converts, even an unset one, and pydantic
with its first adapter was a third of `corral jobs --json`'s start."""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer's conversion of a parameter's value (typer 0.2x); older ones convert without it
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - another typer: its own conversion, unchanged
    RuntimeParam = None  # type: ignore[assignment,misc]

Register = Callable[[typer.Typer], object]  # adds a module's commands to an app


class LazyCommands(MutableMapping[str, Any]):
    """The group's commands by name: the ones built already, plus the names of the lazy ones,
    each built (its whole module at once) when it is looked up."""

    def __init__(
        self,
        built: MutableMapping[str, Any],
        lazy: Mapping[str, Register],
        order: Sequence[str],
    ) -> None:
        self._built = dict(built)
        self._lazy = dict(lazy)  # command name → the register function of its module
        self._order = tuple(order)

    def _load(self, name: str) -> None:
        register = self._lazy[name]
        app = typer.Typer(rich_markup_mode=None)
        register(app)
        group = typer.main.get_group(app)
        for n, cmd in group.commands.items():
            self._built.setdefault(n, cmd)
        for n in [n for n, r in self._lazy.items() if r is register]:
            del self._lazy[n]

    def __getitem__(self, name: str) -> Any:
        if name not in self._built and name in self._lazy:
            self._load(name)
        return self._built[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self._built[name] = cmd
        self._lazy.pop(name, None)

    def __delitem__(self, name: str) -> None:
        self._lazy.pop(name, None)
        self._built.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._lazy

    def _names(self) -> list[str]:
        known = set(self._built) | set(self._lazy)
        first = [n for n in self._order if n in known]
        return first + [n for n in [*self._built, *self._lazy] if n not in set(first)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(set(self._built) | set(self._lazy))


class LazyGroup(TyperGroup):
    """A TyperGroup whose `lazy` commands are built on first use (set `lazy` and `order` on a
    subclass: command name → its module's register function, and the order help lists)."""

    lazy: Mapping[str, Register] = {}
    order: Sequence[str] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(self.commands, self.lazy, self.order)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # names only: nothing is imported to list them


def lazy_module(name: str) -> ModuleType:
    """The module `name`, executed on its first attribute access (importlib's LazyLoader): a
    command module can name what its other commands use without importing it for this one."""
    if (found := sys.modules.get(name)) is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:  # as an import does: `corral.services.queries` is an attribute of its package
        setattr(sys.modules[parent], child, module)
    return module


_STRS = list[str]
# Plain numbers only, short enough to be exact: what int()/float() and typer's adapter read alike.
_INT = re.compile(r"-?[0-9]{1,15}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")
_TYPERS = object()  # "typer's adapter decides"


@functools.cache
def _values(kind: type[Enum]) -> frozenset[object]:
    return frozenset(m.value for m in kind)


def _plain(kind: Any, value: Any, info: Any) -> Any:
    """A value whose conversion cannot differ from typer's, converted; else `_TYPERS`."""
    if kind is str and type(value) is str:
        return value
    if kind == _STRS and type(value) is tuple and value and all(type(v) is str for v in value):
        return list(value)  # an argv, an option given several times
    if isinstance(kind, type) and issubclass(kind, Enum):
        if type(value) is kind:  # its default
            return value
        if type(value) is not str:
            return _TYPERS
        if value in _values(kind):  # a choice, exactly
            return kind(value)
        if info.case_sensitive:
            return _TYPERS
        alike = [m for m in kind if str(m.value).casefold() == value.casefold()]
        return alike[0] if len(alike) == 1 else _TYPERS
    if kind not in (int, float) or info.clamp:
        return _TYPERS
    if type(value) is str:  # an optional number, as typed
        if not (_INT if kind is int else _FLOAT).fullmatch(value):
            return _TYPERS
        value = kind(value)
    if type(value) is not kind:
        return _TYPERS
    low, high = info.min, info.max
    in_range = (low is None or value >= low) and (high is None or value <= high)
    return value if in_range else _TYPERS


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _Light(RuntimeParam):
        """A parameter's conversion by typer's own rules: an unset value (typer's `coerce`), a
        default already of its type and in its range, a string for a `str`, a `Path` that
        passes typer's own checks (`coerce_cli_path`), a plain number given as a string (an
        optional one), a non-empty tuple of strings for a `list[str]` (an argv), an enum's
        default or one of its values (in any case where the option allows) are converted
        here; anything else, and every value typer would refuse (its message is typer's), by
        typer's adapter, built on first use. tests/unit/test_cli_startup.py holds both to the
        same answers."""

        descriptor: TypeDescriptor
        full: list[Any] = field(default_factory=list, compare=False)  # typer's, once built

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            info, kind = self.parameter_info, self.annotation
            if info.parser is None:
                if (done := _plain(kind, value, info)) is not _TYPERS:
                    return done
                if kind is Path and info.path_type is None and type(value) is str:
                    try:  # typer's adapter turns the string into Path(value) first
                        return coerce_cli_path(
                            Path(value), info, path_type=Path, param=param, ctx=ctx
                        )
                    except typer.BadParameter:
                        pass  # refused: typer's adapter says why, in its words
            if not self.full:
                self.full.append(build_runtime_param(self.descriptor))
            return self.full[0]._coerce_value(value, param=param, ctx=ctx)


def _light_or_full(descriptor: Any) -> Any:
    """What typer converts a parameter with: `_Light`, or typer's own for files it opens."""
    if descriptor.file_annotation is not None:
        return build_runtime_param(descriptor)
    return _Light(
        parameter_info=descriptor.parameter_info,
        annotation=descriptor.annotation,
        descriptor=descriptor,
    )


# Every typer parameter of this process (the commands', their help and completion options')
# asks typer.core for its conversion when it first converts a value.
if RuntimeParam is not None and hasattr(typer.core, "build_runtime_param"):
    typer.core.build_runtime_param = _light_or_full
