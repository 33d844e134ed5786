"""`AsyncClient`: every call of the client, over one keep-alive httpx connection pool."""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, overload

import httpx

from corral.domain.ids import resolve
from corral.schemas import api as bodies
from corral.schemas import epics as ev
from corral.schemas import knowledge as kv
from corral.schemas import views

from .errors import ApiError, from_response, unreachable
from .transport import gathering_transport

Stream = Literal["stdout", "stderr"]
DEFAULT_TIMEOUT_S = 30.0
AMBIGUOUS_SHOWN = 6  # of the jobs an ambiguous id names, how many are listed ("…" past 5)
WAIT_POLL_S = 30.0  # one long poll of `wait`; the call repeats it until its own deadline


def _params(**given: Any) -> dict[str, Any]:
    """Query parameters without the ones left out."""
    return {k: v for k, v in given.items() if v is not None}


class AsyncClient:
    """The HTTP API of one Corral engine at `url` (e.g. `http://127.0.0.1:8765`), as the
    holder of `token` (a `corral token create` text): it sees and acts on its tenant only.

    Use it as an async context manager, or call `aclose()`."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ApiError(
                0, "invalid_request", f"the API's URL must be http:// or https://, not {url!r}"
            )
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout_s,
            transport=transport,
            # requests leave in one write (client/transport.py); through a transport mounted
            # for every URL, not as `transport`, so that proxies from the environment
            # (HTTPS_PROXY …, whose own mounts are more specific) still apply
            mounts=None if transport is not None else {"all://": gathering_transport()},
        )
        # A call goes straight to the transport httpx chose for this URL (the environment's
        # proxy when one applies): the client's own layers (URL merging, cookies, auth and
        # redirect handling, none of which the API uses) were half of its CPU per request
        # (bench/api.py); streams (`logs(follow=True)`) still go through the client.
        self._transport = self._http._transport_for_url(httpx.URL(self.url))
        self._timeout = httpx.Timeout(timeout_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        sent = self._http.headers
        if headers:
            sent = sent.copy()
            sent.update(headers)
        timeout = self._timeout if timeout_s is None else httpx.Timeout(timeout_s)
        request = httpx.Request(
            method,
            self.url + path,
            params=params,
            headers=sent,
            json=json_body,
            extensions={"timeout": timeout.as_dict()},
        )
        try:
            r = await self._transport.handle_async_request(request)
            try:
                await r.aread()
            finally:
                await r.aclose()
        except httpx.TransportError as err:
            raise unreachable(self.url, err) from err
        r.request = request
        if r.status_code >= 400:
            raise from_response(r)
        return r.json()

    # ---- jobs ----------------------------------------------------------------------------

    async def submit(
        self,
        command: Sequence[str] = (),
        *,
        prompt: str | None = None,
        role: str | None = None,
        priority: int = 2,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_attempts: int | None = None,
        after: Sequence[str] = (),
        cwd: str | None = None,
        key: str | None = None,
        env_name: str | None = None,
        tenant: str | None = None,
        worker: str | None = None,
        resume_from: str | None = None,
        dedup: str | None = None,
    ) -> bodies.JobCreated:
        """Submit a job (an argv `command`, or a `prompt` for an agent worker); `key` is the
        idempotency key (`corral submit --key`). Over a queue cap: ApiError 429 with
        `retry_after`."""
        body = bodies.JobCreate.model_validate(
            _params(
                command=list(command),
                prompt=prompt,
                role=role,
                priority=priority,
                env=dict(env or {}),
                timeout_s=timeout_s,
                max_attempts=max_attempts,
                after=list(after),
                cwd=cwd,
                env_name=env_name,
                tenant=tenant,
                worker=worker,
                resume_from=resume_from,
                dedup=dedup,
            )
        )
        data = await self._call(
            "POST",
            "/api/v1/jobs",
            json_body=body.model_dump(mode="json", exclude_unset=True),
            headers={"Idempotency-Key": key} if key is not None else None,
        )
        return bodies.JobCreated.model_validate(data)

    async def get(self, job_id: str) -> views.JobShow:
        """A job with its attempts, timeline and agents' traces."""
        return views.JobShow.model_validate(await self._call("GET", f"/api/v1/jobs/{job_id}"))

    async def list(
        self,
        *,
        state: str | None = None,
        role: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        ref: str | None = None,
    ) -> bodies.JobPage:
        """One page of the tenant's jobs, newest first; pass its `next_cursor` for the next;
        `ref`: only the jobs it names (the whole id, or a prefix or suffix of 4+ characters)."""
        data = await self._call(
            "GET",
            "/api/v1/jobs",
            params=_params(state=state, role=role, limit=limit, cursor=cursor, ref=ref),
        )
        return bodies.JobPage.model_validate(data)

    async def resolve(self, ref: str) -> str:
        """The whole id of the tenant's job that `ref` names, as `corral` names jobs locally:
        the whole id, or a unique prefix or suffix of 4+ characters. NotFound when it names
        none of the tenant's jobs, InvalidRequest (listing some) when it names several."""
        page = await self.list(ref=ref, limit=AMBIGUOUS_SHOWN)
        return resolve(ref, [j.id for j in page.jobs])

    async def iter_jobs(
        self, *, state: str | None = None, role: str | None = None, page_size: int = 200
    ) -> AsyncIterator[views.JobDetail]:
        """Every job of the tenant, newest first, fetching page after page."""
        cursor: str | None = None
        while True:
            page = await self.list(state=state, role=role, limit=page_size, cursor=cursor)
            for j in page.jobs:
                yield j
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel(self, job_id: str, reason: str | None = None) -> views.Cancelled:
        """Cancel a job and the jobs it submitted; ApiError 409 when it has ended already."""
        body = _params(reason=reason) or None
        data = await self._call("POST", f"/api/v1/jobs/{job_id}/cancel", json_body=body)
        return views.Cancelled.model_validate(data)

    async def wait(self, job_id: str, timeout_s: float | None = None) -> views.JobDetail:
        """The job once it has ended, long-polling the server; with `timeout_s`, the job as it
        is after that many seconds (ended or not)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = WAIT_POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
            poll = min(WAIT_POLL_S, left)
            data = await self._call(
                "GET",
                f"/api/v1/jobs/{job_id}/wait",
                params={"timeout_s": poll},
                timeout_s=poll + DEFAULT_TIMEOUT_S,
            )
            job = views.JobDetail.model_validate(data)
            if job.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return job

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
    ) -> Awaitable[bodies.LogRange]: ...

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
    ) -> AsyncIterator[bodies.LogRange]: ...

    def logs(
        self,
        job_id: str,
        *,
        stream: Stream = "stdout",
        attempt: int | None = None,
        offset: int = 0,
        limit: int | None = None,
        follow: bool = False,
    ) -> Awaitable[bodies.LogRange] | AsyncIterator[bodies.LogRange]:
        """A byte range of an attempt's output (default: the latest attempt's stdout) —
        `await client.logs(id)`; or with `follow=True` the output as it grows, until the job
        ends — `async for chunk in client.logs(id, follow=True)`."""
        if follow:
            return self._follow(job_id, stream, attempt, offset)
        return self._range(job_id, stream, attempt, offset, limit)

    async def _range(
        self, job_id: str, stream: Stream, attempt: int | None, offset: int, limit: int | None
    ) -> bodies.LogRange:
        params = _params(stream=stream, attempt=attempt, offset=offset, limit=limit)
        data = await self._call("GET", f"/api/v1/jobs/{job_id}/logs", params=params)
        return bodies.LogRange.model_validate(data)

    async def _follow(
        self, job_id: str, stream: Stream, attempt: int | None, offset: int
    ) -> AsyncIterator[bodies.LogRange]:
        params = _params(stream=stream, attempt=attempt, offset=offset, follow="true")
        path = f"/api/v1/jobs/{job_id}/logs"
        try:
            async with self._http.stream(
                "GET",
                path,
                params=params,
                headers={"Accept": "text/event-stream"},
                timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=None),
            ) as r:
                if r.status_code >= 400:
                    await r.aread()
                    raise from_response(r)
                event, data = "message", ""
                async for line in r.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data += line[5:].strip()
                    elif line == "":
                        if event == "log" and data:
                            yield bodies.LogRange.model_validate(json.loads(data))
                        elif event == "end":
                            return
                        event, data = "message", ""
        except httpx.TransportError as err:
            raise unreachable(self.url, err) from err

    async def trace(self, job_id: str) -> views.Trace:
        """An agent job's traces and the policy decisions taken on the way."""
        data = await self._call("GET", f"/api/v1/jobs/{job_id}/trace")
        return views.Trace.model_validate(data)

    # ---- dead-letter queue ----------------------------------------------------------------

    async def dlq(self, *, limit: int = 50, cursor: str | None = None) -> bodies.JobPage:
        """A page of the tenant's dead-lettered jobs, newest first."""
        data = await self._call("GET", "/api/v1/dlq", params=_params(limit=limit, cursor=cursor))
        return bodies.JobPage.model_validate(data)

    async def requeue(self, job_id: str) -> views.Requeued:
        """A fresh copy of a dead-lettered job, with a fresh attempt budget."""
        data = await self._call("POST", f"/api/v1/dlq/{job_id}/requeue")
        return views.Requeued.model_validate(data)

    async def purge(self, jobs: Sequence[str] = (), *, every: bool = False) -> views.Purged:
        """Drop dead-lettered jobs from the queue (`every`: all of the tenant's)."""
        body = {"all": True} if every else {"jobs": list(jobs)}
        data = await self._call("POST", "/api/v1/dlq/purge", json_body=body)
        return views.Purged.model_validate(data)

    # ---- governance -----------------------------------------------------------------------

    async def approvals(self, state: str | None = None) -> builtins.list[views.View]:
        """Approvals of the tenant's jobs, oldest first (`state`: pending, approved …)."""
        data = await self._call("GET", "/api/v1/approvals", params=_params(state=state))
        return [views.Approval.model_validate(a) for a in data]

    async def approve(self, approval_id: str, note: str = "") -> views.View:
        """Approve: the run is released (or the tool call allowed), recorded as this token's."""
        return await self._decide(approval_id, "approve", note)

    async def deny(self, approval_id: str, note: str = "") -> views.View:
        """Deny: the job is denied (or the tool call refused), recorded as this token's."""
        return await self._decide(approval_id, "deny", note)

    async def _decide(self, approval_id: str, verb: str, note: str) -> views.View:
        data = await self._call(
            "POST", f"/api/v1/approvals/{approval_id}/{verb}", json_body={"note": note}
        )
        return views.Approval.model_validate(data)

    async def kill_switches(self) -> builtins.list[views.View]:
        """The active kill switches that apply to the tenant."""
        data = await self._call("GET", "/api/v1/kill-switches")
        return [views.KillSwitch.model_validate(s) for s in data]

    async def engage_kill_switch(
        self,
        reason: str,
        *,
        scope: str = "tenant",
        target: str | None = None,
        expires_in_s: float | None = None,
    ) -> views.View:
        """Deny new runs in a scope and stop the running ones (default: the token's tenant)."""
        body = _params(scope=scope, target=target, reason=reason, expires_in_s=expires_in_s)
        data = await self._call("POST", "/api/v1/kill-switches", json_body=body)
        return views.KillSwitch.model_validate(data)

    async def lift_kill_switch(self, switch_id: str) -> views.View:
        """Lift one active kill switch."""
        data = await self._call("POST", f"/api/v1/kill-switches/{switch_id}/lift")
        return views.KillSwitch.model_validate(data)

    # ---- epics ----------------------------------------------------------------------------

    async def epics(self, limit: int = 50) -> builtins.list[ev.Epic]:
        """The tenant's epics, newest first, each with its tasks' states."""
        data = await self._call("GET", "/api/v1/epics", params=_params(limit=limit))
        return ev.EpicPage.model_validate(data).epics

    async def epic(self, epic_id: str) -> ev.EpicShow:
        """One epic (its id or a unique prefix): tasks, tries, verdicts and waves."""
        data = await self._call("GET", f"/api/v1/epics/{epic_id}")
        return ev.EpicShow.model_validate(data)

    async def cancel_epic(self, epic_id: str, reason: str = "cancelled by operator") -> ev.Epic:
        """Ask the engine to stop an epic (Conflict when it has ended); the reason recorded
        names this token."""
        data = await self._call(
            "POST", f"/api/v1/epics/{epic_id}/cancel", json_body={"reason": reason}
        )
        return ev.Epic.model_validate(data)

    # ---- knowledge ------------------------------------------------------------------------

    async def learnings(
        self,
        q: str | None = None,
        *,
        kind: str | None = None,
        role: str | None = None,
        tier: str | None = None,
        status: str = "all",
        limit: int = 50,
        ref: str | None = None,
    ) -> builtins.list[kv.Learning]:
        """The tenant's learnings: those the full-text search finds for `q`, else the newest;
        with `ref`, those it names (the whole id, or a prefix or suffix of 4+ characters)."""
        params = _params(q=q, type=kind, role=role, tier=tier, status=status, limit=limit, ref=ref)
        data = await self._call("GET", "/api/v1/knowledge", params=params)
        return kv.LearningPage.model_validate(data).learnings

    async def resolve_learning(self, ref: str) -> str:
        """The whole id of the tenant's learning that `ref` names, as `corral knowledge` names
        them locally: the whole id, or a unique prefix or suffix of 4+ characters. NotFound
        when it names none of the tenant's learnings, InvalidRequest when it names several."""
        found = await self.learnings(ref=ref, limit=AMBIGUOUS_SHOWN)
        return resolve(ref, [x.id for x in found], "learning")

    async def learning(self, learning_id: str) -> kv.LearningShow:
        """One learning (its whole id) with its provenance, history and citations."""
        data = await self._call("GET", f"/api/v1/knowledge/{learning_id}")
        return kv.LearningShow.model_validate(data)

    async def promote_learning(self, learning_id: str, note: str = "") -> kv.Learning:
        """Approve a pending learning (needs `govern`), recorded as this token's."""
        data = await self._call(
            "POST", f"/api/v1/knowledge/{learning_id}/promote", json_body={"note": note}
        )
        return kv.Learning.model_validate(data)

    async def retire_learning(self, learning_id: str, reason: str) -> kv.Learning:
        """Stop giving a learning to runs (needs `govern`), recorded as this token's."""
        data = await self._call(
            "POST", f"/api/v1/knowledge/{learning_id}/retire", json_body={"reason": reason}
        )
        return kv.Learning.model_validate(data)

    async def knowledge_stats(self, role: str | None = None) -> kv.KnowledgeStats:
        """Per role of the tenant: runs with and without learnings, and the learnings."""
        data = await self._call("GET", "/api/v1/knowledge/stats", params=_params(role=role))
        return kv.KnowledgeStats.model_validate(data)

    # ---- tokens (admin) -------------------------------------------------------------------

    async def create_token(
        self,
        scopes: Sequence[str],
        *,
        tenant: str | None = None,
        name: str | None = None,
        expires_in_s: float | None = None,
    ) -> views.TokenCreated:
        """A new token (its text in `.token`, this once); needs an admin token."""
        body = _params(scopes=list(scopes), tenant=tenant, name=name, expires_in_s=expires_in_s)
        data = await self._call("POST", "/api/v1/tokens", json_body=body)
        return views.TokenCreated.model_validate(data)

    async def tokens(self) -> builtins.list[views.Token]:
        """Every token, revoked ones too (never a secret); needs an admin token."""
        data = await self._call("GET", "/api/v1/tokens")
        return [views.Token.model_validate(t) for t in data]

    async def revoke_token(self, token_id: str) -> views.Token:
        """Revoke a token at once; needs an admin token."""
        data = await self._call("POST", f"/api/v1/tokens/{token_id}/revoke")
        return views.Token.model_validate(data)


__all__ = ["ApiError", "AsyncClient"]
