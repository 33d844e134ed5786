"""Sealed secrets: what a submission must not store in clear, encrypted with a key kept apart.

A job's secrets (policy/secrets.py decides which) travel from the submitter to the attempt that
needs them through the store, sealed with AES-256-GCM under a key that lives outside the
database: `<data dir>/secrets.key` (0600, 32 random bytes as hex, created by the first process
that seals something), or the file `secrets.key_file` names. Engines that share a PostgreSQL
store must share the key file; an engine without the right key fails the attempt with a clear
error instead of running the job without its secrets (docs/how-to/secrets.md).

At spawn, `reveal_job` puts the real command, environment and prompt back into the job an
attempt runs, adds the secret variables `--secret-env` names from the engine's environment,
and lists every value the attempt's output and traces must not show.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.domain.errors import CorralError, WorkerError
from corral.domain.models import Job
from corral.policy.redact import Redactor
from corral.policy.secrets import Parts, conceal, reveal, secret_values

KEY_BYTES = 32
_VERSION = "v1."
_NONCE = 12


class Keeper:
    """The sealing key of one data directory (read once, created when first needed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = KeyFile(path)
        self._key: bytes | None = None

    def conceal(self, job: Job) -> Job:
        """The job as the store may keep it: its secrets redacted from the command, the
        environment and the prompt (policy/secrets.py), their real values sealed into its
        options."""
        marked = list(job.options.secret_env)
        c = conceal(Parts(command=job.command, env=job.env, prompt=job.prompt), marked)
        if not c.hidden:
            return job
        return job.with_(
            command=c.stored.command,
            env=dict(c.stored.env),
            prompt=c.stored.prompt,
            options=job.options.with_(sealed=self.seal(c.hidden)),
        )

    def seal(self, payload: Mapping[str, Any]) -> str:
        """`payload` as JSON, encrypted and authenticated: `v1.<base64 of nonce + sealed>`."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(_NONCE)
        sealed = AESGCM(self._load(create=True)).encrypt(
            nonce, json.dumps(dict(payload)).encode(), None
        )
        return _VERSION + base64.urlsafe_b64encode(nonce + sealed).decode()

    def unseal(self, token: str) -> dict[str, Any]:
        """The payload of `seal`; WorkerError when it cannot be opened with this key."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            if not token.startswith(_VERSION):
                raise ValueError("unknown format")
            raw = base64.urlsafe_b64decode(token[len(_VERSION) :])
            plain = AESGCM(self._load(create=False)).decrypt(raw[:_NONCE], raw[_NONCE:], None)
            data = json.loads(plain)
        except (InvalidTag, ValueError, binascii.Error) as err:
            raise WorkerError(
                f"cannot open the job's sealed secrets with {self.path} (another "
                f"key sealed them?): {type(err).__name__}"
            ) from None
        if not isinstance(data, dict):
            raise WorkerError("the job's sealed secrets are not an object")
        return data

    def _load(self, *, create: bool) -> bytes:
        if self._key is None:
            try:
                self._key = self._file.load(create=create)
            except KeyFileMissing:
                raise WorkerError(
                    f"the key that sealed this job's secrets is missing: {self.path}"
                ) from None
            except KeyFileError as err:
                raise WorkerError(str(err)) from None
        return self._key


class KeyFileError(CorralError):
    """A key file cannot be read, or holds no key."""

    code = "key_file"


class KeyFileMissing(KeyFileError):
    """The key file does not exist (and was not to be created)."""


class KeyFile:
    """A secret key kept outside the database: a file of `KEY_BYTES` random bytes as hex, 0600,
    created by the first process that needs it. The sealing key (`Keeper`) and the audit chain's
    key (store/chain.py) are both kept this way."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __str__(self) -> str:
        return str(self.path)

    def load(self, *, create: bool) -> bytes:
        """The key; created first when `create` and the file does not exist yet
        (KeyFileMissing when it does not and not `create`)."""
        return self._read() if not create or self.path.exists() else self._create()

    def get(self, *, create: bool) -> bytes | None:
        """The key, or None when the file does not exist and `create` is false."""
        try:
            return self.load(create=create)
        except KeyFileMissing:
            return None

    def _read(self) -> bytes:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            raise KeyFileMissing(f"{self.path} is missing") from None
        except OSError as err:
            raise KeyFileError(f"cannot read {self.path}: {err.strerror}") from None
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != KEY_BYTES:
            raise KeyFileError(f"{self.path} is not a key ({KEY_BYTES} bytes as hex)")
        return key

    def _create(self) -> bytes:
        """A new random key, written so that two processes creating it at once agree: each
        writes its own file and links it into place; the second link fails, and it reads the
        first one's."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, os.urandom(KEY_BYTES).hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        return self._read()


def revealer(keeper: Keeper) -> Callable[[Job], tuple[Job, Redactor]]:
    """For the guardrails at spawn: the real job, and a redactor of its secrets."""

    def reveal(job: Job) -> tuple[Job, Redactor]:
        try:  # the submitting process may lack the engine's --secret-env variables
            found = reveal_job(job, keeper, strict=False)
        except WorkerError:  # the attempt fails on it at spawn; judge what is known
            return job, Redactor()
        return found.job, Redactor(found.secrets)

    return reveal


@dataclass(frozen=True, slots=True, kw_only=True)
class Revealed:
    job: Job  # with the real command, environment (secret variables included) and prompt
    secrets: tuple[str, ...]  # every value its output and traces must not show


def reveal_job(
    job: Job,
    keeper: Keeper | None,
    environ: Mapping[str, str] | None = None,
    *,
    strict: bool = True,
) -> Revealed:
    """The job an attempt really runs, from the job as stored (`strict`: a --secret-env
    variable missing from `environ` is an error, else it is left out)."""
    environ = os.environ if environ is None else environ
    token = job.options.sealed
    marked = job.options.secret_env
    if not isinstance(token, str) and not marked:  # nothing sealed: the job as stored is real
        stored = Parts(command=job.command, env=job.env, prompt=job.prompt)
        return Revealed(job=job, secrets=tuple(secret_values(stored)))
    hidden: dict[str, Any] = {}
    if isinstance(token, str):
        if keeper is None:
            raise WorkerError("this job's secrets are sealed and this worker has no key")
        hidden = keeper.unseal(token)
    stored = Parts(command=job.command, env=job.env, prompt=job.prompt)
    real = reveal(stored, hidden)
    env = dict(real.env)
    for name in marked:
        if name in env:
            continue
        if name in environ:
            env[name] = environ[name]
        elif strict:
            raise WorkerError(f"--secret-env {name}: the engine's environment has no {name}")
    real = Parts(command=real.command, env=env, prompt=real.prompt)
    return Revealed(
        job=job.with_(command=real.command, env=real.env, prompt=real.prompt),
        secrets=tuple(secret_values(real, marked)),
    )
