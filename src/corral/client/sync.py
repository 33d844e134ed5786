"""`Client`: the blocking face of `AsyncClient`. Every method runs the async one on an event
loop in a helper thread (an anyio blocking portal), so both share one implementation and one
keep-alive connection pool."""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

from anyio.from_thread import BlockingPortal, start_blocking_portal

from corral.schemas import api as bodies
from corral.schemas import epics as ev
from corral.schemas import knowledge as kv
from corral.schemas import views

from .http import DEFAULT_TIMEOUT_S, AsyncClient, Stream

T = TypeVar("T")


class Client:
    """The HTTP API of one Corral engine at `url`, as the holder of `token`, in blocking calls:
    the same methods as `AsyncClient`, answering the same schemas. Use it as a context
    manager, or call `close()`."""

    def __init__(self, url: str, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._cm: AbstractContextManager[BlockingPortal] = start_blocking_portal()
        self._portal = self._cm.__enter__()
        try:
            self._async = self._portal.call(self._make, url, token, timeout_s)
        except BaseException:
            self._cm.__exit__(None, None, None)
            raise

    @staticmethod
    async def _make(url: str, token: str, timeout_s: float) -> AsyncClient:
        return AsyncClient(url, token, timeout_s=timeout_s)  # built on the portal's loop

    @property
    def url(self) -> str:
        return self._async.url

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._portal.call(self._async.aclose)
        finally:
            self._cm.__exit__(None, None, None)

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        async def call() -> T:
            return await fn(*args, **kwargs)

        return self._portal.call(call)

    def submit(self, command: Sequence[str] = (), **options: Any) -> bodies.JobCreated:
        """As `AsyncClient.submit`."""
        return self._run(self._async.submit, command, **options)

    def get(self, job_id: str) -> views.JobShow:
        return self._run(self._async.get, job_id)

    def list(
        self,
        *,
        state: str | None = None,
        role: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        ref: str | None = None,
    ) -> bodies.JobPage:
        return self._run(
            self._async.list, state=state, role=role, limit=limit, cursor=cursor, ref=ref
        )

    def resolve(self, ref: str) -> str:
        return self._run(self._async.resolve, ref)

    def iter_jobs(
        self, *, state: str | None = None, role: str | None = None, page_size: int = 200
    ) -> Iterator[views.JobDetail]:
        cursor: str | None = None
        while True:
            page = self.list(state=state, role=role, limit=page_size, cursor=cursor)
            yield from page.jobs
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, job_id: str, reason: str | None = None) -> views.Cancelled:
        return self._run(self._async.cancel, job_id, reason)

    def wait(self, job_id: str, timeout_s: float | None = None) -> views.JobDetail:
        return self._run(self._async.wait, job_id, timeout_s)

    @overload
    def logs(
        self,
        job_id: str,
        *,
        stream: Stream = ...,
        attempt: int | None = ...,
        offset: int = ...,
        limit: int | None = ...,
        follow: Literal[False] = ...,
    ) -> bodies.LogRange: ...

    @overload
    def logs(
        self,
        job_id: str,
        *,
        stream: Stream = ...,
        attempt: int | None = ...,
        offset: int = ...,
        limit: int | None = ...,
        follow: Literal[True],
    ) -> Iterator[bodies.LogRange]: ...

    def logs(
        self,
        job_id: str,
        *,
        stream: Stream = "stdout",
        attempt: int | None = None,
        offset: int = 0,
        limit: int | None = None,
        follow: bool = False,
    ) -> bodies.LogRange | Iterator[bodies.LogRange]:
        """A byte range of the output; with `follow=True` an iterator of the output as it
        grows, until the job ends."""
        if follow:
            return self._follow(job_id, stream, attempt, offset)
        return self._run(
            self._async.logs,
            job_id,
            stream=stream,
            attempt=attempt,
            offset=offset,
            limit=limit,
        )

    def _follow(
        self, job_id: str, stream: Stream, attempt: int | None, offset: int
    ) -> Iterator[bodies.LogRange]:
        chunks = self._async.logs(
            job_id, stream=stream, attempt=attempt, offset=offset, follow=True
        )
        try:
            while True:
                try:
                    yield self._portal.call(chunks.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                self._portal.call(aclose)

    def trace(self, job_id: str) -> views.Trace:
        return self._run(self._async.trace, job_id)

    def dlq(self, *, limit: int = 50, cursor: str | None = None) -> bodies.JobPage:
        return self._run(self._async.dlq, limit=limit, cursor=cursor)

    def requeue(self, job_id: str) -> views.Requeued:
        return self._run(self._async.requeue, job_id)

    def purge(self, jobs: Sequence[str] = (), *, every: bool = False) -> views.Purged:
        return self._run(self._async.purge, jobs, every=every)

    def approvals(self, state: str | None = None) -> builtins.list[views.View]:
        return self._run(self._async.approvals, state)

    def approve(self, approval_id: str, note: str = "") -> views.View:
        return self._run(self._async.approve, approval_id, note)

    def deny(self, approval_id: str, note: str = "") -> views.View:
        return self._run(self._async.deny, approval_id, note)

    def kill_switches(self) -> builtins.list[views.View]:
        return self._run(self._async.kill_switches)

    def engage_kill_switch(
        self,
        reason: str,
        *,
        scope: str = "tenant",
        target: str | None = None,
        expires_in_s: float | None = None,
    ) -> views.View:
        return self._run(
            self._async.engage_kill_switch,
            reason,
            scope=scope,
            target=target,
            expires_in_s=expires_in_s,
        )

    def lift_kill_switch(self, switch_id: str) -> views.View:
        return self._run(self._async.lift_kill_switch, switch_id)

    def create_token(
        self,
        scopes: Sequence[str],
        *,
        tenant: str | None = None,
        name: str | None = None,
        expires_in_s: float | None = None,
    ) -> views.TokenCreated:
        return self._run(
            self._async.create_token, scopes, tenant=tenant, name=name, expires_in_s=expires_in_s
        )

    def tokens(self) -> builtins.list[views.Token]:
        return self._run(self._async.tokens)

    def revoke_token(self, token_id: str) -> views.Token:
        return self._run(self._async.revoke_token, token_id)

    def learnings(
        self,
        q: str | None = None,
        *,
        kind: str | None = None,
        role: str | None = None,
        tier: str | None = None,
        status: str = "all",
        limit: int = 50,
    ) -> builtins.list[kv.Learning]:
        return self._run(
            self._async.learnings, q, kind=kind, role=role, tier=tier, status=status, limit=limit
        )

    def resolve_learning(self, ref: str) -> str:
        return self._run(self._async.resolve_learning, ref)

    def learning(self, learning_id: str) -> kv.LearningShow:
        return self._run(self._async.learning, learning_id)

    def promote_learning(self, learning_id: str, note: str = "") -> kv.Learning:
        return self._run(self._async.promote_learning, learning_id, note)

    def retire_learning(self, learning_id: str, reason: str) -> kv.Learning:
        return self._run(self._async.retire_learning, learning_id, reason)

    def knowledge_stats(self, role: str | None = None) -> kv.KnowledgeStats:
        return self._run(self._async.knowledge_stats, role)

    def epics(self, limit: int = 50) -> builtins.list[ev.Epic]:
        return self._run(self._async.epics, limit)

    def epic(self, epic_id: str) -> ev.EpicShow:
        return self._run(self._async.epic, epic_id)

    def cancel_epic(self, epic_id: str, reason: str = "cancelled by operator") -> ev.Epic:
        return self._run(self._async.cancel_epic, epic_id, reason)


__all__ = ["Client"]
