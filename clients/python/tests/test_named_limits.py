"""The limit a refusal names and the key a waiting admission queued on (issue 41): ``Policy.class_of`` (the
twin of the Rust ``Policy::class_of``), the ``key_class`` of every limiter's refusals, ``Permit.queued_on``
and ``queued_class`` of the Redis limiters (their waiting loop) and of ``HttpLimiter`` (the server's 201
``Inflight-Limit``), and that header read back. Against a real redis-server and a real ``inflight serve``;
every wait is bounded and polled for, never timed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from inflight_client import (
    AsyncPermit,
    AsyncRedisLimiter,
    HttpLimiter,
    Permit,
    Policy,
    RedisLimiter,
    Rule,
    TooManyRequests,
    WeightExceedsLimit,
)
from inflight_client._keys import tag
from inflight_client._refusal import Named, limit_header, queued_header, read_limit_header

BOUND = 20.0  # seconds: every poll gives up (and fails) after this
RULES = [
    {"keys": "app:*", "default": 1},
    {"keys": "app:*:beta", "default": 1},
    {"keys": "global", "default": 1},
]


def until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + BOUND
    while not (value := condition()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)
    return value


def queued(r: redis.Redis, key: str) -> int:
    return int(r.zcard(f"{tag('inflight:', key)}:queue"))


# --- Policy.class_of ------------------------------------------------------------------------------


def test_class_of_is_the_pattern_of_the_rule_or_default() -> None:
    # policy.rs's doc test: Policy::new(10, 0).rule("app:*", ClassLimits::new(5, 0))
    policy = Policy(10, 0, [Rule("app:*", 5)])
    assert policy.class_of("app:a1") == "app:*"
    assert policy.class_of("tenant:t1") == "default"


def test_class_of_picks_the_rule_limits_picks() -> None:
    rules: list[Any] = [
        {"keys": "tenant:*", "default": 50, "max": 200},
        Rule("app:*", 5),
        {"keys": "global", "default": 1000},
        {"keys": "*", "max": 100},
        {"keys": "app:*:beta", "default": 1},
        {"keys": "app:vip*", "default": 9, "max": 10},
    ]
    policy = Policy(0, 0, rules)
    cases = {
        "tenant:t1": "tenant:*",
        "app:a1": "app:*",
        "app:a1:beta": "app:*:beta",
        "app:vip1": "app:vip*",
        "app:vip1:beta": "app:vip*",  # the longer literal prefix wins
        "global": "global",
        "global:eu": "*",
        "": "*",
    }
    for key, pattern in cases.items():
        assert policy.class_of(key) == pattern, key
        (rule,) = [r for r in policy.rules if r.keys == pattern]
        assert policy.limits(key) == rule.limits
    assert Policy(3, 0, [{"keys": "app:*", "default": 5}]).class_of("user:7") == "default"
    assert Policy().class_of("anything") == "default"


# --- the Inflight-Limit header, written and read back ---------------------------------------------


def test_the_limit_header_reads_back_what_it_writes() -> None:
    for key, key_class, limit, in_flight in [
        ("app:a1", "app:*", 5, 5),
        ('a"b\\c', "default", 1, 0),
        ("café%", "caf*", None, None),
        ("k", None, 2, None),
        ("日本", "*本", 4294967295, 7),
    ]:
        written = limit_header(key, key_class, limit, in_flight)
        assert read_limit_header(written) == Named(key, key_class, limit, in_flight), written
    assert limit_header("app:a1", "app:*", 5, 5) == 'key="app:a1"; class="app:*"; limit=5; in_flight=5'
    # As the Rust server writes it, with parameters this client does not know skipped.
    assert read_limit_header('key=%"caf%c3%a9";class="default"; weight=2;x;limit=1') == Named(
        "café", "default", 1, None
    )
    for bad in [None, "", "limit=5", 'key="a', 'key="a" limit=5', 'key=%"%zz"', 'key="\x01"', 'key=%"%ff"']:
        assert read_limit_header(bad) is None, bad


# --- RedisLimiter and AsyncRedisLimiter ------------------------------------------------------------


def test_redis_refusals_name_the_class(r: redis.Redis) -> None:
    limiter = RedisLimiter(r, default_limit=1, limits=RULES)
    try:
        for key, key_class in [("app:a1", "app:*"), ("app:a1:beta", "app:*:beta"), ("user:7", "default")]:
            held = limiter.try_acquire(key)
            with pytest.raises(TooManyRequests) as refused:
                limiter.try_acquire(key)
            assert (refused.value.key, refused.value.key_class) == (key, key_class)
            assert (refused.value.limit, refused.value.in_flight) == (1, 1)
            with pytest.raises(TooManyRequests) as timed_out:  # a wait that ends unadmitted
                limiter.acquire(key, 0.05)
            assert type(timed_out.value) is TooManyRequests and timed_out.value.key_class == key_class
            with pytest.raises(TooManyRequests) as of_several:  # the refusing key's class
                limiter.try_acquire_all(["free:1", key])
            assert (of_several.value.key, of_several.value.key_class) == (key, key_class)
            held.release()
        limiter.set_limit("app:zero", 1)
        with pytest.raises(WeightExceedsLimit) as heavy:
            limiter.try_acquire("app:zero", weight=2)
        assert heavy.value.key_class == "app:*"
    finally:
        limiter.close()


def test_a_redis_waiter_names_the_key_it_queued_on(r: redis.Redis) -> None:
    limiter = RedisLimiter(r, default_limit=1, limits=RULES)
    try:
        first = limiter.try_acquire("app:a1")
        assert (first.queued_on, first.queued_class) == (None, None)
        unqueued = limiter.acquire("app:a2", BOUND)  # room at once: it never queued
        assert unqueued.queued_on is None
        ended: list[Permit] = []
        waiter = threading.Thread(
            target=lambda: ended.append(limiter.acquire_all(["user:7", "app:a1"], BOUND))
        )
        waiter.start()
        until(lambda: queued(r, "app:a1") == 1, "the waiter queued on app:a1")
        first.release()
        waiter.join(BOUND)
        (admitted,) = ended
        assert (admitted.queued_on, admitted.queued_class) == ("app:a1", "app:*")
        # The middleware's header: the figures are the permit's first key's, so none for another key.
        assert queued_header(admitted) == ("Inflight-Limit", 'key="app:a1"; class="app:*"')
        admitted.release()
        unqueued.release()
    finally:
        limiter.close()


def test_an_async_waiter_names_the_key_it_queued_on(redis_url: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        sync = redis.Redis.from_url(redis_url)
        limiter = AsyncRedisLimiter(client, default_limit=1, limits=RULES)
        try:
            first = await limiter.try_acquire("user:7")
            assert first.queued_on is None
            with pytest.raises(TooManyRequests) as refused:
                await limiter.try_acquire("user:7")
            assert refused.value.key_class == "default"
            waiting: asyncio.Task[AsyncPermit] = asyncio.create_task(limiter.acquire("user:7", BOUND))
            await asyncio.to_thread(until, lambda: queued(sync, "user:7") == 1, "the waiter queued")
            await first.release()
            admitted = await asyncio.wait_for(waiting, BOUND)
            assert (admitted.queued_on, admitted.queued_class) == ("user:7", "default")
            assert (admitted.limit, admitted.in_flight) == (1, 1)
            named = 'key="user:7"; class="default"; limit=1; in_flight=1'
            assert queued_header(admitted) == ("Inflight-Limit", named)
            await admitted.release()
        finally:
            await limiter.close()
            await client.aclose()
            sync.close()

    asyncio.run(main())


# --- HttpLimiter and inflight serve ------------------------------------------------------------------


def test_http_limiter_reads_the_class_and_the_key_it_queued_on(serve_factory: Any, redis_url: str) -> None:
    """The server's class for each key is the Python policy's for the same rules, and its 201 after a
    wait names the key (a Display String for one outside ASCII)."""
    limits = [arg for rule in RULES for arg in ("--limit", f"{rule['keys']}={rule['default']}")]
    serve = serve_factory("--store", redis_url, "--default-limit", "1", *limits)
    policy = Policy(1, 0, RULES)
    r = redis.Redis.from_url(redis_url)
    http = HttpLimiter(serve.url)

    def check(key: str) -> None:
        held = http.try_acquire(key)
        assert held.queued_on is None
        with pytest.raises(TooManyRequests) as refused:
            http.try_acquire(key)
        assert (refused.value.key, refused.value.key_class) == (key, policy.class_of(key))
        ended: list[Permit] = []
        waiter = threading.Thread(target=lambda: ended.append(http.acquire(key, BOUND)))
        waiter.start()
        until(lambda: queued(r, key) == 1, f"the waiter queued on {key}")
        held.release()
        waiter.join(BOUND)
        (admitted,) = ended
        assert (admitted.queued_on, admitted.queued_class) == (key, policy.class_of(key))
        assert (admitted.limit, admitted.in_flight) == (1, 1)
        admitted.release()

    try:
        for key in ["app:a1", "app:a1:beta", "global", "global:eu", "user:7", "clé:1"]:
            check(key)
    finally:
        http.close()
        r.close()
