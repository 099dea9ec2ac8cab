"""ASGI middleware: one permit per HTTP request, held for the response's whole life.

::

    app = InflightMiddleware(app, limiter, key=lambda scope: ..., max_wait=5)

``limiter`` is an :class:`~inflight_client.AsyncRedisLimiter` or an :class:`~inflight_client.HttpLimiter`
(whose blocking calls run off the event loop: acquires in asyncio's default executor, releases in a small
pool of the middleware's own, so that waiting acquires never hold up a release). ``key(scope)`` names the
request's key; ``None`` leaves the request unlimited. The permit is held from before the app is called
until the first of:

- the last body chunk has been sent (``http.response.body`` with ``more_body`` false, or
  ``http.response.pathsend``);
- the app receives ``http.disconnect`` (the client went away: a server-sent event stream included);
- the app returns or raises (also when it never started a response).

A stream that never calls ``receive`` learns of a disconnect only if its server fails its next ``send``
(uvicorn drops sends to a closed connection): such a stream holds its slot until it ends. Starlette's
``StreamingResponse`` listens for the disconnect itself.

A refused request is answered 429 and the app is not called: ``Retry-After: 1``,
``Inflight-Limit: key="app:a1"; class="app:*"; limit=5; in_flight=5`` and the JSON body ``{"code":
"too_many_requests", "message": ..., "status": 429, "key": "app:a1", "class": "app:*", "limit": 5,
"in_flight": 5}`` (``too_many_waiters`` when the key's queue is at its bound; the class is the pattern of
the key's rule, or ``"default"``; a class or figure the limiter did not give is ``null`` and left out of
the header). ``max_wait`` (seconds, at most 300) lets a request wait in the key's queue first; ``None`` or
0 refuses at once. A request admitted after it waited in the queue has ``Inflight-Limit`` (that key, its
class and its figures at admission) added to its response's headers. A waiter whose place an admin revoked
(:class:`~inflight_client.Revoked`) is answered 409, ``{"code": "revoked", "message": ..., "status": 409,
"key": "app:a1"}``, and the app is not called.

``holder(scope)``, when given, labels the request's permit (``holder=``: 1 to 128 bytes, no control
characters), which an operator sees listed with its lease and ticket (``GET /v1/keys/{key}/permits``): a
client's address, ``scope["client"][0]``; never a secret. A label the limiter would refuse is logged
(``inflight_client``'s logger) and dropped: the request is admitted without one. ``None`` gives none.

A :class:`~inflight_client.StoreError` (Redis or the server unreachable) is raised, as any other error of
the app's (the server answers 500). Lifespan and WebSocket scopes pass through unlimited: a WebSocket
connection is not a request whose end the middleware could tell.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from . import _input, _refusal
from ._async import AsyncPermit, AsyncRedisLimiter
from ._errors import Revoked
from ._http import HttpLimiter
from ._permit import Permit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RELEASE_THREADS = 4  # the pool that releases HttpLimiter's permits


class InflightMiddleware:
    """Limits the HTTP requests of ``app`` in flight per key (see the module's documentation)."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: AsyncRedisLimiter | HttpLimiter,
        key: Callable[[Scope], str | None],
        max_wait: float | None = None,
        holder: Callable[[Scope], str | None] | None = None,
    ) -> None:
        if not isinstance(limiter, (AsyncRedisLimiter, HttpLimiter)):
            what = type(limiter).__name__
            raise TypeError(f"limiter must be an AsyncRedisLimiter or an HttpLimiter, not {what}")
        if not callable(key):
            raise TypeError("key must be a callable of the request's scope")
        if holder is not None and not callable(holder):
            raise TypeError("holder must be a callable of the request's scope, or None")
        self.app = app
        self.limiter = limiter
        self.key = key
        self.holder = holder
        self.max_wait = 0.0 if max_wait is None else max_wait
        _input.max_wait_ms(self.max_wait)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = self.key(scope)
        if key is None:
            await self.app(scope, receive, send)
            return
        label = None if self.holder is None else _refusal.holder_label(self.holder(scope))
        try:
            permit = await self._acquire(key, label)
        except _refusal.REFUSALS as refused:
            await _send_answer(send, _refusal.answer(refused))
            return
        except Revoked as revoked:
            await _send_answer(send, _refusal.revoked(revoked))
            return
        slot = _Slot(permit, self._releases)
        queued = _refusal.queued_header(permit)
        named = None if queued is None else (queued[0].lower().encode("latin-1"), queued[1].encode("latin-1"))

        async def sending(message: Message) -> None:
            if named is not None and message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), named]}
            await send(message)
            kind = message["type"]
            if (kind == "http.response.body" and not message.get("more_body", False)) or (
                kind == "http.response.pathsend"
            ):
                await slot.release()

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                await slot.release()
            return message

        try:
            await self.app(scope, receiving, sending)
        finally:
            await slot.release()

    async def _acquire(self, key: str, holder: str | None) -> AsyncPermit | Permit:
        limiter = self.limiter
        if isinstance(limiter, AsyncRedisLimiter):
            if self.max_wait:
                return await limiter.acquire(key, self.max_wait, holder=holder)
            return await limiter.try_acquire(key, holder=holder)
        if self.max_wait:
            call = functools.partial(limiter.acquire, key, self.max_wait, holder=holder)
        else:
            call = functools.partial(limiter.try_acquire, key, holder=holder)
        future = asyncio.get_running_loop().run_in_executor(None, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The thread goes on: a permit it gets after all is released.
            future.add_done_callback(self._release_late)
            raise

    def _release_late(self, future: asyncio.Future[Permit]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._releases().submit(future.result().release)

    def _releases(self) -> ThreadPoolExecutor:
        """The pool that releases HttpLimiter's permits, made on first use."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(RELEASE_THREADS, thread_name_prefix="inflight-release")
            return self._pool


class _Slot:
    """The request's permit, released once, by whichever end comes first."""

    def __init__(self, permit: AsyncPermit | Permit, releases: Callable[[], ThreadPoolExecutor]) -> None:
        self._permit: AsyncPermit | Permit | None = permit
        self._releases = releases

    async def release(self) -> None:
        permit, self._permit = self._permit, None
        if permit is None:
            return
        if isinstance(permit, AsyncPermit):
            # Cancelled meanwhile, the release goes on in a task of the limiter's.
            await permit.release()
            return
        # Submitted before the first await: a cancellation cannot stop it.
        done: Future[bool] = self._releases().submit(permit.release)
        await asyncio.shield(asyncio.wrap_future(done))


async def _send_answer(send: Send, answer: _refusal.Answer) -> None:
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
