"""The resolved configuration kept in the data directory, so that a command whose configuration
has not changed does not validate it again (config.py).

One file, `<data dir>/config-cache.json`, holds the last configuration resolved there. It is
used only when everything resolving read is as it was: the file's text and path, the home
directory (`~` in paths), the files the configuration names (MCP configs, the guardrails file:
what they hold, read again by the same paths) and the code that resolves it (its files' size,
inode and modification time). The working directory is not in the key: a path the file gives
relative stays relative to the file's own path, whatever the command's directory, so only what
such a path reads can differ, and that is compared.
Anything else, or a cache that is unreadable, damaged or not the user's own, is a miss: the file
is validated anew, so a cache can make a command faster and never different. A configuration
with problems is never cached: its error comes every time.

It holds what the configuration file holds, nothing from the environment (CORRAL_STORE_URL is
read by every command), and never a secret: a configuration holding what `corral config show`
redacts, a URL with a password or an MCP server's environment or headers is validated by every
command instead. It is JSON, decoded only into the configuration's own frozen classes (never
pickle), written 0600 in the private data directory and replaced atomically.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from corral import config_sections
from corral.config_sections import FileSettings

NAME = "config-cache.json"
_FORMAT = 1
# the code that resolves a configuration: a change to any of it is a change to every cache
_CODE = (
    "config.py",
    "config_models.py",
    "config_sections.py",
    "config_check.py",
    "config_cache.py",
    "domain/settings.py",
    "domain/models.py",
)


_URL_PASSWORD = re.compile(r"://[^/\s@]*:[^/\s@]*@")  # postgresql://user:password@host


class _Miss(Exception):
    """The cache does not hold this configuration."""


class Cache:
    """The cache entry of one configuration text, in one data directory."""

    def __init__(self, data_dir: Path, text: str, path: Path | None) -> None:
        self.file = data_dir / NAME
        self.key = _key(text, path)

    def get(self) -> FileSettings | None:
        """What the configuration resolved to last time, if nothing it read has changed."""
        try:
            entry = _read(self.file)
            if entry.get("format") != _FORMAT or entry.get("key") != self.key:
                raise _Miss
            if entry.get("reads") != _digests(entry["value"]["f"]["reads"]):
                raise _Miss
            found = _decode(entry["value"], _classes())
            if not isinstance(found, FileSettings):
                raise _Miss
            return found
        except (_Miss, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None  # read anew

    def put(self, found: FileSettings) -> None:
        """Keep `found` for the next command; when the data directory cannot hold it, the next
        command validates the file again (no error: the cache is only a shortcut)."""
        try:  # only into a private directory of this user's: one that is still open is
            st = os.stat(self.file.parent)  # narrowed by the command after loading
        except OSError:  # (workers/privacy.py), and the next command writes the cache there
            return
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return
        tmp = self.file.with_name(f".{NAME}.{os.getpid()}")
        try:
            value = _encode(found)  # TypeError: a value JSON cannot hold (a YAML date)
            if _holds_secret(value):
                return
            reads = _digests(value["f"]["reads"])
            entry = {"format": _FORMAT, "key": self.key, "reads": reads, "value": value}
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(entry, out, separators=(",", ":"))
            os.replace(tmp, self.file)
        except (OSError, ValueError, TypeError):
            tmp.unlink(missing_ok=True)


def _holds_secret(value: Any) -> bool:
    """Whether an encoded configuration holds what `corral config show` would redact (a string
    under a secret-looking name in one of the file's own mappings, a string shaped like a
    credential), a URL with a password, or an MCP server's environment or headers: a cache
    never holds a secret."""
    from corral.policy.redact import SECRET_NAME, Redactor

    redactor = Redactor()

    def walk(v: Any, mcp: bool = False) -> bool:
        if isinstance(v, str):
            return redactor.text(v) != v or _URL_PASSWORD.search(v) is not None
        if isinstance(v, list):
            return any(walk(x) for x in v)
        if not isinstance(v, dict):
            return False
        if "@d" in v:  # a mapping of the file's own: its names are the user's
            entries = v["@d"].items()
            if mcp and any(k in ("env", "headers") and e != {"@d": {}} for k, e in entries):
                return True
            return any(
                (isinstance(e, str) and SECRET_NAME.search(k) is not None)
                or walk(e, mcp=mcp or k == "mcp_servers")
                for k, e in entries
            )
        fields = v.get("f", v)
        return any(walk(e, mcp=mcp or k == "mcp_servers") for k, e in fields.items())

    return walk(value)


def _key(text: str, path: Path | None) -> str:
    here = Path(__file__).parent
    code = [_stamp(here / name) for name in _CODE]
    parts = [_FORMAT, str(path) if path else None, text, os.environ.get("HOME"), code]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _stamp(path: Path | str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_ino, st.st_mtime_ns]


def _digests(reads: Any) -> list[Any]:
    """Each file resolving read, with a digest of what it holds now (None: unreadable)."""
    if not isinstance(reads, dict) or not isinstance(items := reads.get("@t"), list):
        raise _Miss
    return [[p, _digest(p)] for p in items if isinstance(p, str)]


def _digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _read(file: Path) -> dict[str, Any]:
    """The entry, from a regular file of this user that no one else may write."""
    fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise _Miss
        entry = json.load(f)
    if not isinstance(entry, dict):
        raise _Miss
    return entry


def _classes() -> dict[str, type]:
    """Every class an entry may name: the configuration's own, and nothing else."""
    from corral.domain import models, settings

    found: dict[str, type] = {"Limits": models.Limits}
    for module in (settings, config_sections):
        for name, obj in vars(module).items():
            own = isinstance(obj, type) and obj.__module__ == module.__name__
            if own and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                found[name] = obj
    return found


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"@": type(value).__name__, "f": fields}
    if isinstance(value, enum.Enum):
        return {"@e": type(value).__name__, "v": value.value}
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tuple):
        return {"@t": [_encode(v) for v in value]}
    if isinstance(value, frozenset):
        return {"@s": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"@d": {k: _encode(v) for k, v in value.items()}}
    raise TypeError(f"the configuration cache cannot hold a {type(value).__name__}")


def _decode(value: Any, classes: dict[str, type]) -> Any:
    if isinstance(value, list):
        return [_decode(v, classes) for v in value]
    if not isinstance(value, dict):
        return value
    if "@d" in value:
        return {k: _decode(v, classes) for k, v in value["@d"].items()}
    if "@t" in value:
        return tuple(_decode(v, classes) for v in value["@t"])
    if "@s" in value:
        return frozenset(_decode(v, classes) for v in value["@s"])
    if "@e" in value:
        return classes[value["@e"]](value["v"])
    cls = classes[value["@"]]
    fields = value["f"]
    names = {f.name for f in dataclasses.fields(cls)}
    if set(fields) != names:
        raise _Miss
    obj: Any = object.__new__(cls)
    for name, v in fields.items():
        object.__setattr__(obj, name, _decode(v, classes))
    return obj
