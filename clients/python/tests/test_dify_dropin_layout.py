"""The drop-in under ``layout="dify"`` as Dify really runs: limits changed on a patched worker, long leases
against Dify's eviction, and ``REDIS_KEY_PREFIX``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from dify_released import DifyRedis, Refused, ReleasedDify

from inflight_client import RedisLimiter, TooManyRequests, dify
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


def test_with_a_key_prefix_from_the_environment_both_of_difys_keys_are_prefixed(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_KEY_PREFIX", " tenant-a ")  # read and stripped as Dify does
    limiter = dify.configure(r, layout="dify")
    try:
        worker = ReleasedDify(DifyRedis(r, "tenant-a"), APP, 4)  # Dify 1.16.1 with the prefix
        assert worker.enter() and worker.enter()
        rate_limit = RateLimit(APP, 4)
        assert r.get(f"tenant-a:{LIMIT}") == b"4" and r.get(LIMIT) is None
        assert len(admitted(rate_limit, 10)) == 2  # Dify's two entries counted
        with pytest.raises(Refused):
            worker.enter()  # and the drop-in's counted by Dify's HLEN
        assert r.hlen(f"tenant-a:{HASH}") == 4 and not r.exists(HASH)
        assert limiter.status(APP).limit == 4
        r.set(f"tenant-a:{LIMIT}", 5, ex=86400)  # a limit set by a prefixed Dify worker applies
        assert len(admitted(rate_limit, 10)) == 1
    finally:
        dify.configure(r)


def test_through_difys_prefixing_client_each_key_is_prefixed_once(r: redis.Redis) -> None:
    dify.configure(DifyRedis(r, "tenant-a"), layout="dify", key_prefix="tenant-a")  # type: ignore[arg-type]
    try:
        rate_limit = RateLimit(APP, 4)
        assert r.get(f"tenant-a:{LIMIT}") == b"4"
        r.set(f"tenant-a:{LIMIT}", 2, ex=100)
        rate_limit.flush_cache()  # reads it, and gives it back its day
        assert rate_limit.max_active_requests == 2 and r.ttl(f"tenant-a:{LIMIT}") > 86000
        assert len(admitted(rate_limit, 5)) == 2
        assert r.hlen(f"tenant-a:{HASH}") == 2
        assert r.keys("tenant-a:tenant-a:*") == [] and r.keys("dify:*") == []
    finally:
        dify.configure(r)


def test_in_inflights_layout_a_prefixing_client_changes_no_key(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``REDIS_KEY_PREFIX``, inflight's layout keeps its own names (its scripts reach Redis unprefixed),
    so every patched worker and ``inflight serve`` with the default prefix count in the same keys."""
    monkeypatch.setenv("REDIS_KEY_PREFIX", "tenant-a")
    dify.configure(DifyRedis(r, "tenant-a"))  # type: ignore[arg-type]
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


def test_redis_limiter_on_difys_layout_needs_a_limit_for_cold_apps(r: redis.Redis) -> None:
    # A cold app (no limit key written by Dify) takes the default, else the ceiling; with neither it would
    # be admitted without limit, so the limiter refuses to be made, as `inflight serve --layout dify` does.
    with pytest.raises(ValueError, match="APP_DEFAULT_ACTIVE_REQUESTS"):
        RedisLimiter(r, layout="dify")
    with RedisLimiter(r, max_limit=2, layout="dify") as ceiling:
        first = ceiling.try_acquire(APP)
        assert first.limit == 2
        second = ceiling.try_acquire(APP)  # (kept: a permit collected unreleased is released)
        with pytest.raises(TooManyRequests):
            ceiling.try_acquire(APP)
        first.release()
        second.release()
    assert dify.configure(r, layout="dify") is not None  # the drop-in passes each app's limit itself
    dify.configure(r)
