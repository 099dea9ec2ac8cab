"""Each error a caller may see, from each limiter: TypeError for an argument of the wrong type, ValueError
for one out of range (both before any store is asked: the stores here are unreachable), UnexpectedAnswer
for an answer the client cannot read; StoreError only for an outage."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
import redis.asyncio
from conftest import free_port
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from inflight_client import (
    AsyncRedisLimiter,
    HttpLimiter,
    InflightError,
    RedisLimiter,
    Rule,
    StoreError,
    UnexpectedAnswer,
    dify,
)

# (argument errors): a call's keyword arguments and the error they must raise.
WRONG_TYPES: list[dict[str, Any]] = [
    {"key": None},
    {"key": b"k"},
    {"key": 5},
    {"weight": True},
    {"weight": 1.0},
    {"weight": "2"},
    {"weight": None},
    {"lease": True},
    {"lease": "30"},
    {"id": 7},
    {"id": b"req"},
]
OUT_OF_RANGE: list[dict[str, Any]] = [
    {"key": ""},
    {"key": "k" * 257},
    {"key": "é" * 129},
    {"key": "a\nb"},
    {"key": "\x7f"},
    {"key": "\ud800"},  # not UTF-8
    {"weight": 0},
    {"weight": -1},
    {"weight": 2**32},
    {"lease": math.inf},
    {"lease": -math.inf},
    {"lease": math.nan},
    {"lease": 0.05},
    {"lease": 86_401},
    {"id": ""},
    {"id": "x" * 257},
    {"id": "a\tb"},
]


def _acquire_args(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    args = dict(case)
    return args.pop("key", "k"), args


@pytest.fixture
def dead_redis() -> Iterator[redis.Redis]:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    yield client
    client.close()


@pytest.mark.parametrize("case", WRONG_TYPES, ids=repr)
def test_sync_type_errors(case: dict[str, Any], dead_redis: redis.Redis) -> None:
    key, args = _acquire_args(case)
    for limiter in (
        RedisLimiter(dead_redis, default_limit=1),
        HttpLimiter(f"http://127.0.0.1:{free_port()}"),
    ):
        with pytest.raises(TypeError):
            limiter.try_acquire(key, **args)
        with pytest.raises(TypeError):
            limiter.try_acquire_all([key, "other"], **args)
        limiter.close()


@pytest.mark.parametrize("case", OUT_OF_RANGE, ids=repr)
def test_sync_value_errors(case: dict[str, Any], dead_redis: redis.Redis) -> None:
    key, args = _acquire_args(case)
    for limiter in (
        RedisLimiter(dead_redis, default_limit=1),
        HttpLimiter(f"http://127.0.0.1:{free_port()}"),
    ):
        with pytest.raises(ValueError):
            limiter.try_acquire(key, **args)
        with pytest.raises(ValueError):
            limiter.try_acquire_all(["other", key], **args)
        limiter.close()


def test_async_type_and_value_errors() -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(
            port=free_port(), socket_connect_timeout=0.2, retry=AsyncRetry(NoBackoff(), 0)
        )
        limiter = AsyncRedisLimiter(client, default_limit=1)
        try:
            for cases, error in ((WRONG_TYPES, TypeError), (OUT_OF_RANGE, ValueError)):
                for case in cases:
                    key, args = _acquire_args(case)
                    with pytest.raises(error):
                        await limiter.try_acquire(key, **args)
                    with pytest.raises(error):
                        await limiter.try_acquire_all([key], **args)
            with pytest.raises(TypeError):
                await limiter.status(None)  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await limiter.status("")
            with pytest.raises(TypeError):
                await limiter.set_limit("k", True)
            with pytest.raises(ValueError):
                await limiter.set_limit("k", 2**32)
            with pytest.raises(TypeError):
                await limiter.release("k", None)  # type: ignore[arg-type]
            with pytest.raises(StoreError):  # a good argument reaches the store, which is away
                await limiter.status("k")
        finally:
            await limiter.close()
            await client.aclose()

    asyncio.run(main())


# The waiting acquires' own arguments (with a good max_wait unless the case gives one).
WAIT_WRONG_TYPES: list[dict[str, Any]] = [
    {"max_wait": None},
    {"max_wait": "1"},
    {"max_wait": True},
    {"priority": True},
    {"priority": 1.0},
    {"priority": None},
    {"flow": None},
    {"flow": b"f"},
]
WAIT_OUT_OF_RANGE: list[dict[str, Any]] = [
    {"max_wait": -1},
    {"max_wait": 300.001},
    {"max_wait": math.inf},
    {"priority": 256},
    {"priority": -1},
    {"flow": "é" * 129},
    {"flow": "\ud800"},
]
WAIT_CASES = [(case, TypeError) for case in WRONG_TYPES + WAIT_WRONG_TYPES] + [
    (case, ValueError) for case in OUT_OF_RANGE + WAIT_OUT_OF_RANGE
]


def _wait_args(case: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    key, args = _acquire_args(case)
    return key, {"max_wait": 5.0, **args}


@pytest.mark.parametrize(("case", "error"), WAIT_CASES, ids=repr)
def test_waiting_acquires_refuse_before_asking(
    case: dict[str, Any], error: type[Exception], dead_redis: redis.Redis
) -> None:
    key, args = _wait_args(case)
    for limiter in (
        RedisLimiter(dead_redis, default_limit=1),
        HttpLimiter(f"http://127.0.0.1:{free_port()}"),
    ):
        with pytest.raises(error):
            limiter.acquire(key, **args)
        with pytest.raises(error):
            limiter.acquire_all(["other", key], **args)
        limiter.close()

    async def main() -> None:
        client = redis.asyncio.Redis(
            port=free_port(), socket_connect_timeout=0.2, retry=AsyncRetry(NoBackoff(), 0)
        )
        limiter = AsyncRedisLimiter(client, default_limit=1)
        try:
            with pytest.raises(error):
                await limiter.acquire(key, **args)
            with pytest.raises(error):
                await limiter.acquire_all([key], **args)
        finally:
            await limiter.close()
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("make", ["redis", "http"])
def test_status_limits_release_and_keys(make: str, dead_redis: redis.Redis) -> None:
    limiter: RedisLimiter | HttpLimiter = (
        RedisLimiter(dead_redis, default_limit=1)
        if make == "redis"
        else HttpLimiter(f"http://127.0.0.1:{free_port()}")
    )
    calls: list[tuple[Callable[[], Any], type[Exception]]] = [
        (lambda: limiter.status(None), TypeError),  # type: ignore[arg-type]
        (lambda: limiter.status(b"k"), TypeError),  # type: ignore[arg-type]
        (lambda: limiter.status(""), ValueError),
        (lambda: limiter.status("k\x00"), ValueError),
        (lambda: limiter.set_limit("k", True), TypeError),
        (lambda: limiter.set_limit("k", 1.5), TypeError),  # type: ignore[arg-type]
        (lambda: limiter.set_limit("k", -1), ValueError),
        (lambda: limiter.set_limit("k", 2**32), ValueError),
        (lambda: limiter.set_limit("", 1), ValueError),
        (lambda: limiter.release("k", None), TypeError),  # type: ignore[arg-type]
        (lambda: limiter.release("k", ""), ValueError),
        (lambda: limiter.release("k", "id", token=True), TypeError),
        (lambda: limiter.release("k", "id", token=-1), ValueError),
        (lambda: limiter.try_acquire_all("ab"), TypeError),
        (lambda: limiter.try_acquire_all(None), TypeError),  # type: ignore[arg-type]
        (lambda: limiter.try_acquire_all([]), ValueError),
        (lambda: limiter.try_acquire_all([f"k{i}" for i in range(17)]), ValueError),
    ]
    try:
        for call, error in calls:
            with pytest.raises(error):
                call()
        with pytest.raises(StoreError):  # a good argument reaches the store, which is away
            limiter.status("k")
    finally:
        limiter.close()


def test_limiters_refuse_bad_settings(dead_redis: redis.Redis) -> None:
    leases: list[tuple[Any, type[Exception]]] = [
        (math.inf, ValueError),
        (0.01, ValueError),
        (True, TypeError),
        ("1", TypeError),
    ]
    limits: list[tuple[Any, type[Exception]]] = [
        (2**32, ValueError),
        (-1, ValueError),
        (True, TypeError),
        (1.5, TypeError),
    ]
    for lease, error in leases:
        with pytest.raises(error):
            RedisLimiter(dead_redis, lease=lease)
        with pytest.raises(error):
            HttpLimiter("http://127.0.0.1:1", lease=lease)
        with pytest.raises(error):
            AsyncRedisLimiter(redis.asyncio.Redis(port=1), lease=lease)
    for limit, error in limits:
        with pytest.raises(error):
            RedisLimiter(dead_redis, default_limit=limit)
        with pytest.raises(error):
            RedisLimiter(dead_redis, max_limit=limit)
        with pytest.raises(error):
            RedisLimiter(dead_redis, limits=[Rule("a:*", default=limit)])
        with pytest.raises(error):
            RedisLimiter(dead_redis, limits=[Rule("a:*", max=limit)])
    with pytest.raises(ValueError):
        RedisLimiter(dead_redis, dify_stale_after=math.nan, layout="dify")


def test_the_dify_drop_in(dead_redis: redis.Redis) -> None:
    dify.configure(dead_redis)
    try:
        with pytest.raises(ValueError):
            dify.RateLimit("a" * 300, 5).enter()  # the key app:<id> is over 256 bytes
        with pytest.raises(ValueError):
            dify.RateLimit("app", 5).enter("req\n")
        with pytest.raises(ValueError):
            dify.RateLimit("app", 2**32).enter()
        with pytest.raises(ValueError):
            dify.RateLimit("app", 5).exit("")
        with pytest.raises(ValueError):
            dify.configure(dead_redis, max_limit=-1)
        with pytest.raises(TypeError):
            dify.configure(dead_redis, lease=None)  # type: ignore[arg-type]
        with pytest.raises(StoreError):  # a good request id reaches Redis, which is away
            dify.RateLimit("app", 5).enter("req-1")
    finally:
        dify.configure(dead_redis).close()


def test_under_gevent(redis_url: str) -> None:
    pytest.importorskip("gevent")
    program = textwrap.dedent(
        f"""
        from gevent import monkey
        monkey.patch_all()
        import math, redis
        from inflight_client import RedisLimiter

        limiter = RedisLimiter(redis.Redis.from_url({redis_url!r}), default_limit=1)
        for call, error in (
            (lambda: limiter.try_acquire(b"k"), TypeError),
            (lambda: limiter.try_acquire("k", weight=True), TypeError),
            (lambda: limiter.try_acquire("k", lease=math.inf), ValueError),
            (lambda: limiter.try_acquire(""), ValueError),
            (lambda: limiter.status(None), TypeError),
        ):
            try:
                call()
            except error:
                continue
            raise AssertionError(call)
        limiter.try_acquire("gevent-ok").release()
        print("ok", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "ok"


class _FakeServer:
    """An HTTP server that answers every request with the status and body set in ``answer``."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (200, b"")
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, body = fake.answer
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _reply

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[_FakeServer]:
    server = _FakeServer()
    yield server
    server.close()


PERMIT = (
    b'{"id": "p", "key": "k", "weight": 1, "limit": 2, "in_flight": 1, "lease_expires_at_ms": 9, "token": 3}'
)
UNREADABLE: list[tuple[str, int, bytes]] = [
    ("acquire", 201, b"<html>ok</html>"),
    ("acquire", 201, b"[1, 2]"),
    ("acquire", 201, b'{"key": "k"}'),  # no id
    ("acquire", 201, PERMIT.replace(b'"id": "p"', b'"id": 5')),
    ("acquire", 201, PERMIT.replace(b'"in_flight": 1', b'"in_flight": "1"')),
    ("acquire", 201, PERMIT.replace(b'"lease_expires_at_ms": 9', b'"lease_expires_at_ms": true')),
    ("acquire", 200, PERMIT),  # a status the API never answers there
    ("acquire", 502, b"<html>Bad Gateway</html>"),  # a proxy's page, not the API's error
    ("acquire", 400, b'{"message": "no code"}'),
    ("all", 201, b'{"id": "p", "weight": 1, "keys": []}'),
    ("all", 201, b'{"id": "p", "weight": 1, "keys": [{"limit": 1}]}'),
    ("status", 200, b"not json"),
    ("status", 200, b'{"limit": 2}'),
    ("status", 200, b'{"limit": "2", "in_flight": 0}'),
    ("status", 200, b'\xff\xfe{"in_flight": 0}'),
    ("set_limit", 200, b'{"in_flight": -1}'),
    ("release", 503, b"Service Unavailable"),
]


@pytest.mark.parametrize(("call", "status", "body"), UNREADABLE, ids=lambda v: repr(v)[:40])
def test_an_answer_the_client_cannot_read(fake: _FakeServer, call: str, status: int, body: bytes) -> None:
    fake.answer = (status, body)
    limiter = HttpLimiter(fake.url, lease=5.0)
    actions: dict[str, Callable[[], Any]] = {
        "acquire": lambda: limiter.try_acquire("k"),
        "all": lambda: limiter.try_acquire_all(["k", "j"]),
        "status": lambda: limiter.status("k"),
        "set_limit": lambda: limiter.set_limit("k", 2),
        "release": lambda: limiter.release("k", "id"),
    }
    try:
        with pytest.raises(UnexpectedAnswer) as raised:
            actions[call]()
        assert not isinstance(raised.value, StoreError)
        assert isinstance(raised.value, InflightError)
        assert raised.value.status == status
    finally:
        limiter.close()


def test_a_readable_answer_still_reads(fake: _FakeServer) -> None:
    fake.answer = (201, PERMIT)
    limiter = HttpLimiter(fake.url, lease=5.0)
    try:
        permit = limiter.try_acquire("k")
        assert (permit.id, permit.limit, permit.in_flight, permit.token) == ("p", 2, 1, 3)
        fake.answer = (204, b"")
        assert permit.release() is True
    finally:
        limiter.close()


def test_a_script_answer_the_client_cannot_read(r: redis.Redis) -> None:
    with RedisLimiter(r, default_limit=1) as limiter:
        for reply in ([b"x", 1], "OK", [1, 2], None):
            limiter._call = lambda *args, reply=reply: reply  # type: ignore[method-assign]
            with pytest.raises(UnexpectedAnswer) as raised:
                limiter.try_acquire("k")
            assert raised.value.status is None and not isinstance(raised.value, StoreError)
            with pytest.raises(UnexpectedAnswer):
                limiter.status("k")
