"""WSGI middleware: one permit per request, held until the server closes the response.

::

    app.wsgi_app = InflightMiddleware(app.wsgi_app, limiter, key=lambda environ: ..., max_wait=5)

``limiter`` is a :class:`~inflight_client.RedisLimiter` or an :class:`~inflight_client.HttpLimiter`;
``key(environ)`` names the request's key, ``None`` leaves it unlimited. The permit is taken before the app
is called and released exactly once: when the server calls the response iterable's ``close()`` (PEP 3333:
after the last chunk was written, or once writing failed because the client went away), or at once when
the app raises. A streamed response therefore holds its slot while it streams. A WSGI server learns that
a client left only when a write fails: a stream blocked between two chunks holds its slot until its next
chunk. Should a server never call ``close()``, the permit's finalizer releases it once the response is
garbage-collected.

Safe under threads (gunicorn's ``gthread``) and gevent (``-k gevent``): the limiters use ``threading``
and redis-py only, which gevent patches; a waiting acquire waits in its own greenlet.

A refused request is answered 429 and the app is not called: ``Retry-After: 1``,
``Inflight-Limit: key="app:a1"; limit=5; in_flight=5`` and the JSON body ``{"code": "too_many_requests",
"message": ..., "status": 429, "key": "app:a1", "limit": 5, "in_flight": 5}`` (``too_many_waiters`` when
the key's queue is at its bound; a figure the limiter did not give is ``null`` and left out of the header).
``max_wait`` (seconds, at most 300) lets a request wait in the key's queue first; ``None`` or 0 refuses at
once. A :class:`~inflight_client.StoreError` (Redis or the server unreachable) is raised (the server
answers 500).

The response iterable is wrapped, so a ``wsgi.file_wrapper`` response is sent by iteration rather than by
``sendfile``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from . import _input, _refusal
from ._http import HttpLimiter
from ._permit import Permit
from ._redis import RedisLimiter

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment


class InflightMiddleware:
    """Limits the requests of ``app`` in flight per key (see the module's documentation)."""

    def __init__(
        self,
        app: WSGIApplication,
        limiter: RedisLimiter | HttpLimiter,
        key: Callable[[WSGIEnvironment], str | None],
        max_wait: float | None = None,
    ) -> None:
        if not isinstance(limiter, (RedisLimiter, HttpLimiter)):
            raise TypeError(f"limiter must be a RedisLimiter or an HttpLimiter, not {type(limiter).__name__}")
        if not callable(key):
            raise TypeError("key must be a callable of the WSGI environ")
        self.app = app
        self.limiter = limiter
        self.key = key
        self.max_wait = 0.0 if max_wait is None else max_wait
        _input.max_wait_ms(self.max_wait)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        key = self.key(environ)
        if key is None:
            return self.app(environ, start_response)
        try:
            if self.max_wait:
                permit = self.limiter.acquire(key, self.max_wait)
            else:
                permit = self.limiter.try_acquire(key)
        except _refusal.REFUSALS as refused:
            answer = _refusal.answer(refused)
            start_response(f"{_refusal.STATUS} {_refusal.REASON}", answer.headers)
            return [answer.body]
        try:
            response = self.app(environ, start_response)
        except BaseException:
            permit.release()
            raise
        return _HeldResponse(response, permit)


class _HeldResponse:
    """The app's response iterable, holding the permit until the server closes it."""

    def __init__(self, response: Iterable[bytes], permit: Permit) -> None:
        self._response = response
        self._permit = permit

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._response)

    def close(self) -> None:
        try:
            close = getattr(self._response, "close", None)
            if callable(close):
                close()
        finally:
            self._permit.release()  # idempotent: a second close() releases nothing
