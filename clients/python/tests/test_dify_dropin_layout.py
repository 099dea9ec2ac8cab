"""The drop-in under ``layout="dify"`` as Dify really runs: limits changed on a patched worker, long leases
against Dify's eviction, and ``REDIS_KEY_PREFIX``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from inflight_client import RedisLimiter, dify
from inflight_client.dify import AppInvokeQuotaExceededError, RateLimit

APP = "9b2f4c1e-0d3a-4e5f-8a6b-7c8d9e0f1a2b"
HASH = f"dify:rate_limit:{APP}:active_requests"
LIMIT = f"dify:rate_limit:{APP}:max_active_requests"


@pytest.fixture
def limiter(r: redis.Redis) -> Iterator[RedisLimiter]:
    yield dify.configure(r, layout="dify", key_prefix="")
    dify.configure(r)  # closes it


def admitted(rate_limit: RateLimit, at_most: int) -> list[str]:
    ids: list[str] = []
    for _ in range(at_most):
        try:
            ids.append(rate_limit.enter())
        except AppInvokeQuotaExceededError:
            break
    return ids


def test_a_limit_changed_on_a_patched_worker_applies(limiter: RedisLimiter, r: redis.Redis) -> None:
    r.set(LIMIT, 8, ex=86400)  # written by unpatched workers
    assert len(admitted(RateLimit(APP, 3), 10)) == 3  # down: the new limit, not the cached 8
    assert r.get(LIMIT) == b"3"  # where Dify's workers read it, with Dify's day
    assert 86000 < r.ttl(LIMIT) <= 86400
    assert len(admitted(RateLimit(APP, 6), 10)) == 3  # up: 6 in all
    assert r.get(LIMIT) == b"6"
    assert r.hlen(HASH) == 6
    rate_limit = RateLimit(APP, 6)
    rate_limit.flush_cache(use_local_value=True)  # AppService.update_app's call
    r.set(LIMIT, 7, ex=86400)  # and an unpatched worker's change applies to the patched ones
    assert len(admitted(rate_limit, 10)) == 1


def test_flush_cache_reads_the_limit_as_difys_does(limiter: RedisLimiter, r: redis.Redis) -> None:
    rate_limit = RateLimit(APP, 2)
    r.set(LIMIT, 5)
    rate_limit.flush_cache()
    assert rate_limit.max_active_requests == 5
    assert 86000 < r.ttl(LIMIT) <= 86400


def redis_now(r: redis.Redis) -> float:
    """The Redis clock, in seconds."""
    seconds, micros = r.time()
    return float(seconds) + float(micros) / 1e6


def dify_flush(r: redis.Redis, hash_name: str, stale_after: float) -> None:
    """Dify's eviction in its flush: entries older than the stale age go (the Redis clock here)."""
    now = redis_now(r)
    for request_id, at in r.hgetall(hash_name).items():
        if now - float(at) > stale_after:
            r.hdel(hash_name, request_id)


def test_a_long_lease_keeps_its_entry_inside_difys_eviction_age(r: redis.Redis) -> None:
    dify.configure(r, layout="dify", lease=1800.0, dify_stale_after=0.9, key_prefix="")
    try:
        rate_limit = RateLimit(APP, 2)
        started = redis_now(r)
        request_id = rate_limit.enter()
        # Past the stale age (on the Redis clock, 1.2 s at most): the entry's start time is its lease's
        # end less the stale age.
        while redis_now(r) < started + 1.2:
            time.sleep(0.05)
        dify_flush(r, HASH, 0.9)
        assert r.hexists(HASH, request_id)
        rate_limit.exit(request_id)
    finally:
        dify.configure(r)


class PrefixedDifyWorker:
    """Dify's newest RateLimit with REDIS_KEY_PREFIX, as it reaches Redis: the limit key through the
    wrapper's named methods (prefixed), the admitting script through register_script on the raw client
    (its KEYS unprefixed), the exit's HDEL through the wrapper (prefixed)."""

    SCRIPT = """
    if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return nil end
    return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    """

    def __init__(self, r: redis.Redis, prefix: str, client_id: str, limit: int) -> None:
        self.r, self.prefix, self.limit = r, prefix, limit
        self.hash_name = f"dify:rate_limit:{client_id}:active_requests"
        r.set(f"{prefix}:dify:rate_limit:{client_id}:max_active_requests", limit, ex=86400)
        self.admit = r.register_script(self.SCRIPT)

    def enter(self) -> str | None:
        request_id = str(uuid.uuid4())
        ok = self.admit(keys=[self.hash_name], args=[request_id, str(time.time()), self.limit])
        return request_id if ok is not None else None


def test_with_a_key_prefix_the_drop_in_and_difys_workers_count_in_one_hash(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_KEY_PREFIX", " tenant-a ")  # read and stripped as Dify does
    limiter = dify.configure(r, layout="dify")
    try:
        worker = PrefixedDifyWorker(r, "tenant-a", APP, 4)
        assert worker.enter() and worker.enter()
        rate_limit = RateLimit(APP, 4)
        assert r.get(f"tenant-a:{LIMIT}") == b"4" and r.get(LIMIT) is None
        assert len(admitted(rate_limit, 10)) == 2  # Dify's two entries counted
        assert worker.enter() is None  # and the drop-in's counted by Dify's script
        assert r.hlen(HASH) == 4
        assert limiter.status(APP).limit == 4
        r.set(f"tenant-a:{LIMIT}", 5, ex=86400)  # a limit set by a prefixed Dify worker applies
        assert len(admitted(rate_limit, 10)) == 1
    finally:
        dify.configure(r)


class PrefixingClient:
    """Dify's ``redis_client`` with ``REDIS_KEY_PREFIX`` set, in its behaviour: the names given to its named
    methods get ``<prefix>:`` before them; everything else (``eval``, ``evalsha``, ``register_script``,
    ``pipeline``) reaches the client as it is."""

    NAMED = ("get", "set", "setex", "exists", "expire", "delete", "hset", "hgetall", "hdel", "hlen", "ttl")

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client, self._prefix = client, prefix

    def __getattr__(self, item: str) -> Any:
        method = getattr(self._client, item)
        if item not in self.NAMED:
            return method
        return lambda name, *args, **kwargs: method(f"{self._prefix}:{name}", *args, **kwargs)


def test_through_difys_prefixing_client_the_limit_key_is_prefixed_once(r: redis.Redis) -> None:
    client = PrefixingClient(r, "tenant-a")
    dify.configure(client, layout="dify", key_prefix="tenant-a")  # type: ignore[arg-type]
    try:
        rate_limit = RateLimit(APP, 4)
        assert r.get(f"tenant-a:{LIMIT}") == b"4"
        assert r.keys("tenant-a:tenant-a:*") == []
        r.set(f"tenant-a:{LIMIT}", 2, ex=100)
        rate_limit.flush_cache()  # reads it, and gives it back its day
        assert rate_limit.max_active_requests == 2 and r.ttl(f"tenant-a:{LIMIT}") > 86000
        assert len(admitted(rate_limit, 5)) == 2
    finally:
        dify.configure(r)


def test_in_inflights_layout_a_prefixing_client_changes_no_key(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``REDIS_KEY_PREFIX``, inflight's layout keeps its own names (its scripts reach Redis unprefixed),
    so every patched worker and ``inflight serve`` with the default prefix count in the same keys."""
    monkeypatch.setenv("REDIS_KEY_PREFIX", "tenant-a")
    dify.configure(PrefixingClient(r, "tenant-a"))  # type: ignore[arg-type]
    try:
        rate_limit = RateLimit(APP, 2)
        ids = admitted(rate_limit, 4)
        assert len(ids) == 2
        assert r.keys("tenant-a:*") == []
        with RedisLimiter(r) as plain:  # a process on the same Redis, without the prefix
            assert plain.status(f"app:{APP}").in_flight == 2
            for request_id in ids:
                rate_limit.exit(request_id)
            assert plain.status(f"app:{APP}").in_flight == 0
    finally:
        dify.configure(r)
