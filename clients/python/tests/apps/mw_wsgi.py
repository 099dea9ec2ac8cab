"""The app the WSGI middleware's tests run under gunicorn (tests/test_wsgi.py).

A Flask app behind the middleware, with a ``RedisLimiter`` on ``TEST_REDIS_URL`` (default limit 2, and 2 for
the class ``rule:*``) or an ``HttpLimiter`` on ``TEST_SERVE_URL``. The query names the key (``key=``;
``/ready`` is unlimited) and, with ``wait=1``, sends the request through the middleware that waits
(``max_wait`` 30 s). Each permit is labelled with ``holder=`` of the query, else ``REMOTE_ADDR``. Each
admitted request counts itself (``test:calls:{key}``) and records the in-flight count it sees
(``test:seen:{key}``); it blocks where the test says until the test pushes to ``test:go:{rid}``. ``/nostart``
and ``/raise`` are bare WSGI: the one never calls ``start_response``, the other raises before it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import redis
from flask import Flask, Response, request

from inflight_client import HttpLimiter, RedisLimiter
from inflight_client.wsgi import InflightMiddleware

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

SIGNALS = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
limiter: RedisLimiter | HttpLimiter
if os.environ.get("TEST_SERVE_URL"):
    limiter = HttpLimiter(os.environ["TEST_SERVE_URL"])
else:
    limiter = RedisLimiter(
        redis.Redis.from_url(os.environ["TEST_REDIS_URL"]),
        default_limit=2,
        limits=[{"keys": "rule:*", "default": 2}],
    )


def query(environ: WSGIEnvironment) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(environ.get("QUERY_STRING", "")).items()}


def key_of(environ: WSGIEnvironment) -> str | None:
    return None if environ["PATH_INFO"] == "/ready" else query(environ).get("key", "app:a1")


def holder_of(environ: WSGIEnvironment) -> str | None:
    """The query's ``holder=`` (a bad one is dropped by the middleware), else the client's address."""
    return query(environ).get("holder", environ.get("REMOTE_ADDR"))


def admitted(key: str) -> None:
    """Counts the call and records the in-flight count the app sees."""
    SIGNALS.incr(f"test:calls:{key}")
    SIGNALS.rpush(f"test:seen:{key}", limiter.status(key).in_flight)


def go(rid: str) -> None:
    """Blocks until the test pushes to ``test:go:{rid}``."""
    SIGNALS.blpop([f"test:go:{rid}"], timeout=60)


site = Flask(__name__)


@site.get("/ready")
def ready() -> str:
    return "ok"


@site.get("/stream")
def stream() -> Response:
    key, rid, then = request.args["key"], request.args["rid"], request.args["then"]
    admitted(key)

    def body() -> Iterator[bytes]:
        yield b"first\n"
        go(rid)
        if then == "raise":
            raise RuntimeError("the app failed mid-stream")
        while then == "forever":
            yield b"more\n"
            time.sleep(0.01)
        yield b"last\n"

    return Response(body(), mimetype="text/plain")


@site.get("/hang")
def hang() -> str:
    admitted(request.args["key"])
    go(request.args["rid"])
    return "done\n"


def inner(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    if environ["PATH_INFO"] == "/nostart":
        admitted(query(environ)["key"])
        return [b"no start_response\n"]
    if environ["PATH_INFO"] == "/raise":  # (Flask would answer 500 itself)
        admitted(query(environ)["key"])
        raise RuntimeError("the app failed before its response")
    return site.wsgi_app(environ, start_response)


at_once = InflightMiddleware(inner, limiter, key_of, holder=holder_of)
waiting = InflightMiddleware(inner, limiter, key_of, max_wait=30, holder=holder_of)


def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    through = waiting if query(environ).get("wait") == "1" else at_once
    return through(environ, start_response)
