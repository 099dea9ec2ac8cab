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
``Inflight-Limit: key="app:a1"; class="app:*"; limit=5; in_flight=5`` and the JSON body ``{"code":
"too_many_requests", "message": ..., "status": 429, "key": "app:a1", "class": "app:*", "limit": 5,
"in_flight": 5}`` (``too_many_waiters`` when the key's queue is at its bound; the class is the pattern of
the key's rule, or ``"default"``; a class or figure the limiter did not give is ``null`` and left out of
the header). ``max_wait`` (seconds, at most 300) lets a request wait in the key's queue first; ``None`` or
0 refuses at once. A request admitted after it waited in the queue has ``Inflight-Limit`` (that key, its
class and its figures at admission) added to the headers the app starts its response with. A waiter whose
place an admin revoked (:class:`~inflight_client.Revoked`) is answered 409, ``{"code": "revoked",
"message": ..., "status": 409, "key": "app:a1"}``, and the app is not called.

``holder(environ)``, when given, labels the request's permit (``holder=``: 1 to 128 bytes, no control
characters), which an operator sees listed with its lease and ticket (``GET /v1/keys/{key}/permits``): a
client's address, ``environ["REMOTE_ADDR"]``; never a secret. A label the limiter would refuse is logged
(``inflight_client``'s logger) and dropped: the request is admitted without one. ``None`` gives none.

A :class:`~inflight_client.StoreError` (Redis or the server unreachable) is raised (the server answers
500).

The response iterable is wrapped, so a ``wsgi.file_wrapper`` response is sent by iteration rather than by
``sendfile``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import _input, _refusal
from ._errors import Revoked
from ._http import HttpLimiter
from ._permit import Permit
from ._redis import RedisLimiter

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment


class InflightMiddleware:
    """Limits the requests of ``app`` in flight per key (see the module's documentation)."""

    def __init__(
        self,
        app: WSGIApplication,
        limiter: RedisLimiter | HttpLimiter,
        key: Callable[[WSGIEnvironment], str | None],
        max_wait: float | None = None,
        holder: Callable[[WSGIEnvironment], str | None] | None = None,
    ) -> None:
        if not isinstance(limiter, (RedisLimiter, HttpLimiter)):
            raise TypeError(f"limiter must be a RedisLimiter or an HttpLimiter, not {type(limiter).__name__}")
        if not callable(key):
            raise TypeError("key must be a callable of the WSGI environ")
        if holder is not None and not callable(holder):
            raise TypeError("holder must be a callable of the WSGI environ, or None")
        self.app = app
        self.limiter = limiter
        self.key = key
        self.holder = holder
        self.max_wait = 0.0 if max_wait is None else max_wait
        _input.max_wait_ms(self.max_wait)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        key = self.key(environ)
        if key is None:
            return self.app(environ, start_response)
        label = None if self.holder is None else _refusal.holder_label(self.holder(environ))
        try:
            if self.max_wait:
                permit = self.limiter.acquire(key, self.max_wait, holder=label)
            else:
                permit = self.limiter.try_acquire(key, holder=label)
        except _refusal.REFUSALS as refused:
            return _answer(start_response, _refusal.answer(refused))
        except Revoked as revoked:
            return _answer(start_response, _refusal.revoked(revoked))
        queued = _refusal.queued_header(permit)
        if queued is not None:
            start_response = _adding(start_response, queued)
        try:
            response = self.app(environ, start_response)
        except BaseException:
            permit.release()
            raise
        return _HeldResponse(response, permit)


def _answer(start_response: StartResponse, answer: _refusal.Answer) -> list[bytes]:
    start_response(f"{answer.status} {answer.reason}", answer.headers)
    return [answer.body]


def _adding(start_response: StartResponse, header: tuple[str, str]) -> StartResponse:
    """``start_response`` adding ``header`` to the app's headers."""

    def start(status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /) -> Any:
        return start_response(status, [*headers, header], exc_info)

    return start


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
