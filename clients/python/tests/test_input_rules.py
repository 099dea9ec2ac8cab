"""The client refuses exactly what ``inflight serve`` refuses (issue "Hostile clients, round two", item 1).

Each row of the table is sent as it is to the real server (its HTTP API, memory store), and given to every
limiter of the client (HttpLimiter on that server, RedisLimiter and AsyncRedisLimiter on Redis): the
server answers 400 with its JSON error exactly for the rows that the limiters refuse with ``TypeError`` or
``ValueError`` (before asking any store). Rows of a type JSON cannot carry (bytes, an infinite lease) are
sent as the nearest thing the server could get: what ``json.dumps`` writes, which the server refuses.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from inflight_client import AsyncRedisLimiter, HttpLimiter, InflightError, RedisLimiter

LIMIT = 100_000

# (what, value): what is the argument the row gives; value as the caller gives it.
KEYS: list[object] = [
    "k",
    "app/1 x",
    "é" * 128,  # 256 bytes
    "é" * 128 + "a",  # 257 bytes
    "a" * 256,
    "a" * 257,
    "",
    "a\x00b",
    "tab\there",
    "del\x7f",
    "c1\x85",
    "nbsp\xa0",  # not a control character
    "zero\u200bwidth",  # a format character (Cf), not a control
    "{braces}%",
]
IDS: list[object] = [None, "req-1", "x" * 256, "x" * 257, "", "id\n", "é" * 129, 5]
WEIGHTS: list[object] = [1, 2, 2**32 - 1, 2**32, 0, -1, True, 1.0, "1"]
LEASES: list[object] = [None, 0.1, 0.099, 1, 30.5, 86_400, 86_400.001, 0, -1, math.inf, math.nan, True, "1"]
LIMITS: list[object] = [0, 1, 2**32 - 1, 2**32, -1, True, 1.5, "3"]
MAX_WAITS: list[object] = [0, 0.001, 0.0004, 1, 300, 300.001, -1, math.inf, math.nan, True, "1"]
PRIORITIES: list[object] = [0, 1, 255, 256, -1, True, 1.0, "1"]
FLOWS: list[object] = ["", "tenant-a", "é" * 128, "é" * 128 + "a", "a" * 257, "a\x00b\n", "\ud800", 5]
HOLDERS: list[object] = [
    None,
    "py-worker-1",
    "é" * 64,  # 128 bytes
    "é" * 64 + "a",  # 129 bytes
    "a" * 128,
    "a" * 129,
    "",
    "10.0.0.7:443 (pod a-1)",
    "a\x00b",
    "tab\there",
    "del\x7f",
    "c1\x85",
    "nbsp\xa0",
    "\ud800",
    5,
]
TOKENS: list[object] = [0, 7, 2**63 - 1, -1, 1.5, True]  # 2**63 and above: see test_tokens_above_i64
KEY_LISTS: list[object] = [
    ["a"],
    ["a", "b", "a"],
    [f"k{i}" for i in range(16)],
    [f"k{i}" for i in range(16)] + ["k0", "k1"],
    [f"k{i}" for i in range(17)],
    [],
    ["a", ""],
    ["a", "b\x01"],
    [None],
]


class Server:
    def __init__(self, url: str) -> None:
        self.url = url

    def send(self, method: str, path: str, body: str | None = None) -> int:
        """The status of the request, 422 standing for a 400 that refuses the input (the API's
        ``invalid_request`` or ``invalid_key``; a 400 ``weight_exceeds_limit`` refuses the admission).
        A permit it admits is released at once."""
        data = None if body is None else body.encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", "Bearer secret")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, raw = int(response.status), response.read()
        except urllib.error.HTTPError as error:
            status, raw = int(error.code), error.read()
        if status == 400 and json.loads(raw)["code"] in ("invalid_request", "invalid_key"):
            status = 422
        if status == 201:
            admitted = json.loads(raw)
            place = "/v1/permits" if "keys" in admitted else f"/v1/keys/{_quote(admitted['key'])}/permits"
            assert self.send("DELETE", f"{place}/{_quote(admitted['id'])}") == 204
        assert status in (200, 201, 204, 400, 409, 422), (method, path, body, status)
        return status


def _json(value: object) -> str:
    return json.dumps(value)


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def server_accepts(server: Server, what: str, value: Any) -> bool:
    """Whether the server takes the row's value: any answer but an input's refusal (a 409 or a 400
    ``weight_exceeds_limit`` refuses the admission, not the input)."""
    if what == "key":
        status = server.send("POST", "/v1/permits", _json({"keys": [value]}))
        if value:  # in a path too (an empty one is no path the API has)
            in_path = server.send("POST", f"/v1/keys/{_quote(value)}/permits", "{}")
            assert (in_path == 422) == (status == 422), (value, status, in_path)
            assert (server.send("GET", f"/v1/keys/{_quote(value)}") == 422) == (status == 422)
    elif what == "id":
        body = "{}" if value is None else "{" + f'"id": {_json(value)}' + "}"
        status = server.send("POST", "/v1/keys/k/permits", body)
    elif what == "weight":
        status = server.send("POST", "/v1/keys/k/permits", "{" + f'"weight": {_json(value)}' + "}")
    elif what == "lease":
        if value is None:
            body = "{}"
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            body = "{" + f'"lease_ms": {round(value * 1000)}' + "}"  # the client's seconds, as whole ms
        else:
            body = "{" + f'"lease_ms": {_json(value)}' + "}"  # Infinity, NaN, true, "1"
        status = server.send("POST", "/v1/keys/k/permits", body)
    elif what == "max_wait":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            body = "{" + f'"wait_ms": {round(value * 1000)}' + "}"  # the client's seconds, as whole ms
        else:
            body = "{" + f'"wait_ms": {_json(value)}' + "}"
        status = server.send("POST", "/v1/keys/k/permits", body)
    elif what in ("priority", "flow"):
        status = server.send("POST", "/v1/keys/k/permits", "{" + f'"{what}": {_json(value)}' + "}")
    elif what in ("holder", "waiter's holder"):
        fields = [] if value is None else [f'"holder": {_json(value)}']
        if what == "holder":
            status = server.send("POST", "/v1/keys/k/permits", "{" + ", ".join(fields) + "}")
        else:  # (a waiting acquire on several keys)
            fields += ['"keys": ["k"]', '"wait_ms": 1000']
            status = server.send("POST", "/v1/permits", "{" + ", ".join(fields) + "}")
    elif what == "limit":
        status = server.send("PUT", "/v1/keys/k/limit", "{" + f'"limit": {_json(value)}' + "}")
        server.send("DELETE", "/v1/keys/k/limit")
    elif what == "token":
        status = server.send("DELETE", f"/v1/keys/k/permits/id?token={_quote(str(value).lower())}")
    elif what == "keys":
        status = server.send("POST", "/v1/permits", _json({"keys": value}))
    else:
        raise AssertionError(what)
    return status != 422


def sync_call(limiter: RedisLimiter | HttpLimiter, what: str, value: Any) -> None:
    if what == "key":
        limiter.try_acquire(value).release()
        limiter.status(value)
    elif what == "id":
        limiter.try_acquire("k", id=value).release()
    elif what == "weight":
        limiter.try_acquire("k", weight=value).release()
    elif what == "lease":
        limiter.try_acquire("k", lease=value).release()
    elif what == "max_wait":
        limiter.acquire("k", value).release()
    elif what == "priority":
        limiter.acquire("k", 1, priority=value).release()
    elif what == "flow":
        limiter.acquire("k", 1, flow=value).release()
    elif what == "holder":
        limiter.try_acquire("k", holder=value).release()
    elif what == "waiter's holder":
        limiter.acquire_all(["k"], 1, holder=value).release()
    elif what == "limit":
        limiter.set_limit("k", value)
        limiter.clear_limit("k")
    elif what == "token":
        limiter.release("k", "id", token=value)
    elif what == "keys":
        limiter.try_acquire_all(value).release()


async def async_call(limiter: AsyncRedisLimiter, what: str, value: Any) -> None:
    if what == "key":
        await (await limiter.try_acquire(value)).release()
        await limiter.status(value)
    elif what == "id":
        await (await limiter.try_acquire("k", id=value)).release()
    elif what == "weight":
        await (await limiter.try_acquire("k", weight=value)).release()
    elif what == "lease":
        await (await limiter.try_acquire("k", lease=value)).release()
    elif what == "max_wait":
        await (await limiter.acquire("k", value)).release()
    elif what == "priority":
        await (await limiter.acquire("k", 1, priority=value)).release()
    elif what == "flow":
        await (await limiter.acquire("k", 1, flow=value)).release()
    elif what == "holder":
        await (await limiter.try_acquire("k", holder=value)).release()
    elif what == "waiter's holder":
        await (await limiter.acquire_all(["k"], 1, holder=value)).release()
    elif what == "limit":
        await limiter.set_limit("k", value)
        await limiter.clear_limit("k")
    elif what == "token":
        await limiter.release("k", "id", token=value)
    elif what == "keys":
        await (await limiter.try_acquire_all(value)).release()


def accepts(call: Callable[[], None]) -> bool:
    """False when the call refuses its argument (TypeError, ValueError); True otherwise, also when the
    store refused the admission (an InflightError such as WeightExceedsLimit: the input was taken)."""
    try:
        call()
    except (TypeError, ValueError):
        return False
    except InflightError as error:
        assert type(error).__name__ in ("WeightExceedsLimit", "TooManyRequests"), repr(error)
    return True


ROWS = (
    [("key", v) for v in KEYS]
    + [("id", v) for v in IDS]
    + [("weight", v) for v in WEIGHTS]
    + [("lease", v) for v in LEASES]
    + [("max_wait", v) for v in MAX_WAITS]
    + [("priority", v) for v in PRIORITIES]
    + [("flow", v) for v in FLOWS]
    + [("holder", v) for v in HOLDERS]
    + [("waiter's holder", v) for v in HOLDERS]
    + [("limit", v) for v in LIMITS]
    + [("token", v) for v in TOKENS]
    + [("keys", v) for v in KEY_LISTS]
)


@pytest.fixture
def server(serve_factory: Any) -> Server:
    return Server(serve_factory("--default-limit", str(LIMIT), "--admin-token", "secret").url)


def test_the_client_refuses_exactly_what_the_server_refuses(server: Server, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    http = HttpLimiter(server.url, token="secret")
    sync = RedisLimiter(client, default_limit=LIMIT)

    async def async_accepts(limiter: AsyncRedisLimiter, what: str, value: Any) -> bool:
        try:
            await async_call(limiter, what, value)
        except (TypeError, ValueError):
            return False
        except InflightError as error:
            assert type(error).__name__ in ("WeightExceedsLimit", "TooManyRequests"), repr(error)
        return True

    async def async_verdicts() -> list[bool]:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        limiter = AsyncRedisLimiter(aclient, default_limit=LIMIT)
        try:
            return [await async_accepts(limiter, what, value) for what, value in ROWS]
        finally:
            await limiter.close()
            await aclient.aclose()

    try:
        by_async = asyncio.run(async_verdicts())
        mismatches = []
        refused = 0
        for (what, value), async_verdict in zip(ROWS, by_async, strict=True):
            verdicts = {
                "server": server_accepts(server, what, value),
                "HttpLimiter": accepts(functools.partial(sync_call, http, what, value)),
                "RedisLimiter": accepts(functools.partial(sync_call, sync, what, value)),
                "AsyncRedisLimiter": async_verdict,
            }
            refused += not verdicts["server"]
            if len(set(verdicts.values())) != 1:
                mismatches.append((what, repr(value)[:40], verdicts))
        assert mismatches == []
        assert 0 < refused < len(ROWS)  # the table has rows of both kinds
        # Nothing admitted by the table is left held.
        for key in ("k", "a", "b", "k0"):
            assert http.status(key).in_flight == 0
            assert sync.status(key).in_flight == 0
    finally:
        http.close()
        sync.close()
        client.close()


def test_tokens_above_i64_are_refused_by_the_client_alone(server: Server) -> None:
    """The one known difference: the HTTP API parses a token as a u64, but tokens come from Redis
    integers (i64), so the client refuses 2**63 and above; the server takes them (and matches nothing)."""
    assert server_accepts(server, "token", 2**63)
    http = HttpLimiter(server.url)
    try:
        with pytest.raises(ValueError, match="token"):
            http.release("k", "id", token=2**63)
    finally:
        http.close()
