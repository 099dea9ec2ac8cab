"""The app the ASGI middleware's tests run under uvicorn (tests/test_asgi.py).

The limiter: an ``AsyncRedisLimiter`` on ``TEST_REDIS_URL`` (default limit 2, and 2 for the class ``rule:*``),
or an ``HttpLimiter`` on ``TEST_SERVE_URL``. The query names the key (``key=``; ``/ready`` is unlimited) and,
with ``wait=1``, sends the request through the middleware that waits (``max_wait`` 30 s) rather than the one
that refuses at once. Each permit is labelled with ``holder=`` of the query, else the client's address. Each
admitted request counts itself (``test:calls:{key}``) and records the in-flight count it sees
(``test:seen:{key}``); it blocks where the test says until the test pushes to ``test:go:{rid}``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import parse_qs

import redis.asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from inflight_client import AsyncRedisLimiter, HttpLimiter
from inflight_client.asgi import InflightMiddleware, Message, Receive, Scope, Send

SIGNALS = redis.asyncio.Redis.from_url(os.environ["TEST_REDIS_URL"])
limiter: AsyncRedisLimiter | HttpLimiter
if os.environ.get("TEST_SERVE_URL"):
    limiter = HttpLimiter(os.environ["TEST_SERVE_URL"])
else:
    limiter = AsyncRedisLimiter(
        redis.asyncio.Redis.from_url(os.environ["TEST_REDIS_URL"]),
        default_limit=2,
        limits=[{"keys": "rule:*", "default": 2}],
    )


def query(scope: Scope) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(scope["query_string"].decode()).items()}


def key_of(scope: Scope) -> str | None:
    return None if scope["path"] == "/ready" else query(scope).get("key", "app:a1")


def holder_of(scope: Scope) -> str | None:
    """The query's ``holder=`` (a bad one is dropped by the middleware), else the client's address."""
    client = scope.get("client")
    return query(scope).get("holder", client[0] if client else None)


async def admitted(key: str) -> None:
    """Counts the call and records the in-flight count the app sees."""
    if isinstance(limiter, HttpLimiter):
        status = await asyncio.to_thread(limiter.status, key)
    else:
        status = await limiter.status(key)
    await SIGNALS.incr(f"test:calls:{key}")
    await SIGNALS.rpush(f"test:seen:{key}", status.in_flight)


async def go(rid: str) -> None:
    """Blocks until the test pushes to ``test:go:{rid}``."""
    await SIGNALS.blpop([f"test:go:{rid}"], timeout=60)


async def stream(request: Request) -> Response:
    key, rid, then = request.query_params["key"], request.query_params["rid"], request.query_params["then"]
    await admitted(key)

    async def body() -> Any:
        yield b"first\n"
        await go(rid)
        if then == "raise":
            raise RuntimeError("the app failed mid-stream")
        while then == "forever":
            yield b"more\n"
            await asyncio.sleep(0.01)
        yield b"last\n"

    return StreamingResponse(body(), media_type="text/plain")


async def hang(request: Request) -> Response:
    await admitted(request.query_params["key"])
    await go(request.query_params["rid"])
    return PlainTextResponse("done\n")


async def fail(request: Request) -> Response:
    await admitted(request.query_params["key"])
    raise RuntimeError("the app failed before its response")


async def ready(request: Request) -> Response:
    return PlainTextResponse("ok")


site = Starlette(
    routes=[
        Route("/ready", ready),
        Route("/stream", stream),
        Route("/hang", hang),
        Route("/raise", fail),
    ]
)


async def events(scope: Scope, receive: Receive, send: Send) -> None:
    """Server-sent events in plain ASGI: one event, then the wait for the client's disconnect (as an
    event stream learns of it), then for the test's go; it marks its end in ``test:ended:{rid}``."""
    params = query(scope)
    await admitted(params["key"])
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
    message: Message = {"type": ""}
    while message["type"] != "http.disconnect":
        message = await receive()
    await go(params["rid"])
    await SIGNALS.set(f"test:ended:{params['rid']}", 1)


async def inner(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http" and scope["path"] == "/sse":
        await events(scope, receive, send)
    else:
        await site(scope, receive, send)


at_once = InflightMiddleware(inner, limiter, key_of, holder=holder_of)
waiting = InflightMiddleware(inner, limiter, key_of, max_wait=30, holder=holder_of)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    through = waiting if scope["type"] == "http" and query(scope).get("wait") == "1" else at_once
    await through(scope, receive, send)
