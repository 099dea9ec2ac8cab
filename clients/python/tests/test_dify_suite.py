"""Dify's own unit tests of ``RateLimit``, behaviour by behaviour, on the drop-in and a real Redis, in both
of its layouts (inflight's keys, and Dify's own with ``layout="dify"``).

Dify's tests (``api/tests/unit_tests/core/app/features/rate_limiting/test_rate_limit.py`` as released in Dify
1.16.1, commit 59b879d2df, whose ``RateLimit`` admits with HLEN then HSET as every release does) mock
``redis_client``. Where each behaviour is tested here:

=========================================================  ===================================================
Dify's test                                                the drop-in's
=========================================================  ===================================================
same_instance_for_same_client_id, different_instances_...,  test_dify.py::TestRateLimit (same names)
initialize_with_valid_parameters, skip_initialization_if_
disabled, disabled_when_max_requests_is_zero_or_negative
(constructing an app's instance again)                     test_constructing_again_keeps_what_is_held
set_redis_keys_on_first_flush                              test_constructing_writes_only_difys_limit_key
sync_max_requests_from_redis_on_subsequent_flush           test_a_limit_stored_in_redis_applies
clean_timeout_requests_from_active_list                    test_stale_entries_stop_counting
flush_cache_when_interval_exceeded                         test_a_changed_limit_applies_at_the_next_enter
allow_request_within_limit, generate_request_id_...,       test_dify.py::TestRateLimitEnterExit (same names),
use_provided_request_id, remove_request_on_exit,           and test_enter_and_exit below on both layouts
raise_quota_exceeded_when_at_limit, allow_request_after_
previous_exit, return_unlimited_id_when_disabled,
ignore_exit_for_unlimited_requests
TestRateLimitGenerator (6 tests)                           test_dify.py::TestRateLimitGenerator (same names),
                                                           and test_a_stream_gives_its_slot_back below
TestRateLimitConcurrency (3 tests)                         test_dify.py::TestRateLimitConcurrency (same names)
flush_cache_when_reinitializing_existing_instance,         test_a_limit_passed_again_applies_at_once
reinitialize_after_being_disabled
(Dify's rate_limit_context re-enters a held id)            test_reentering_a_held_id_at_the_limit_is_admitted
=========================================================  ===================================================

Left out, as they check how Dify talks to Redis rather than what it does: which call was made and with
which arguments (``setex``/``hset``/``hdel`` ``assert_called_*``, ``flush_cache`` called by ``enter`` after
5 minutes). The drop-in makes none of these calls: it runs inflight's scripts, reads the limit in the same
step as each admission, and has no interval. In its
own layout ``flush_cache`` does nothing and no limit key is written; on Dify's layout, constructing and
``flush_cache`` write and read Dify's limit key as Dify's class does (``set_redis_keys_on_first_flush``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from inflight_client import RedisLimiter, dify
from inflight_client.dify import AppInvokeQuotaExceededError, RateLimit

APP = "7c2d4e6f-8a9b-4c1d-9e2f-3a4b5c6d7e8f"


@pytest.fixture(params=["inflight", "dify"])
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def configured(r: redis.Redis, layout: str) -> Iterator[RedisLimiter]:
    limiter = dify.configure(r, layout=layout, lease=1.0)
    yield limiter
    limiter.close()


def key_of(limiter: RedisLimiter) -> str:
    return APP if limiter.layout == "dify" else f"app:{APP}"


def held(limiter: RedisLimiter) -> int:
    return limiter.status(key_of(limiter)).in_flight


def dify_hash(app: str = APP) -> str:
    return f"dify:rate_limit:{app}:active_requests"


def test_enter_and_exit(configured: RedisLimiter, r: redis.Redis, layout: str) -> None:
    rate_limit = RateLimit(APP, 2)
    first = rate_limit.enter()
    assert len(first) == 36 and rate_limit.enter("given") == "given"
    assert held(configured) == 2
    if layout == "dify":
        assert set(r.hkeys(dify_hash())) == {first.encode(), b"given"}  # Dify's workers count them
    with pytest.raises(AppInvokeQuotaExceededError, match=f"for {APP} is 2"):
        rate_limit.enter()
    rate_limit.exit(first)
    assert held(configured) == 1
    rate_limit.exit("given")
    assert held(configured) == 0
    assert RateLimit("other", 0).enter() == "unlimited_request_id"


def test_a_stream_gives_its_slot_back(configured: RedisLimiter) -> None:
    rate_limit = RateLimit(APP, 1)
    stream = rate_limit.generate(iter(["a", "b"]), rate_limit.enter())
    assert held(configured) == 1
    assert list(stream) == ["a", "b"]
    assert held(configured) == 0


def test_constructing_again_keeps_what_is_held(configured: RedisLimiter) -> None:
    first = RateLimit(APP, 2)
    request_id = first.enter()
    again = RateLimit(APP, 2)
    assert again is first and hasattr(again, "initialized")
    assert held(configured) == 1
    again.exit(request_id)
    assert held(configured) == 0


def test_constructing_writes_only_difys_limit_key(
    configured: RedisLimiter, r: redis.Redis, layout: str
) -> None:
    RateLimit(APP, 5)
    if layout == "dify":  # where Dify's workers read it, for a day, as Dify's constructor writes it
        assert r.keys("*") == [f"dify:rate_limit:{APP}:max_active_requests".encode()]
        assert r.get(f"dify:rate_limit:{APP}:max_active_requests") == b"5"
    else:
        RateLimit(APP, 0)
        assert r.dbsize() == 0


def test_a_limit_stored_in_redis_applies(configured: RedisLimiter, r: redis.Redis, layout: str) -> None:
    rate_limit = RateLimit(APP, 5)
    if layout == "dify":
        r.set(f"dify:rate_limit:{APP}:max_active_requests", 1, ex=86400)  # as another Dify worker writes it
    else:
        configured.set_limit(rate_limit.key, 1)  # an override set through inflight
    request_id = rate_limit.enter()
    with pytest.raises(AppInvokeQuotaExceededError, match="is 1"):
        rate_limit.enter()
    rate_limit.exit(request_id)


def test_a_changed_limit_applies_at_the_next_enter(
    configured: RedisLimiter, r: redis.Redis, layout: str
) -> None:
    rate_limit = RateLimit(APP, 3)
    ids = [rate_limit.enter(), rate_limit.enter()]
    if layout == "dify":
        r.set(f"dify:rate_limit:{APP}:max_active_requests", 2, ex=86400)
    else:
        configured.set_limit(rate_limit.key, 2)
    with pytest.raises(AppInvokeQuotaExceededError, match="is 2"):
        rate_limit.enter()  # no 5-minute wait: the limit is read with each admission
    for request_id in ids:
        rate_limit.exit(request_id)


def test_a_limit_passed_again_applies_at_once(configured: RedisLimiter) -> None:
    rate_limit = RateLimit(APP, 3)
    request_id = rate_limit.enter()
    RateLimit(APP, 1)  # the app's setting lowered in Dify
    with pytest.raises(AppInvokeQuotaExceededError, match="is 1"):
        rate_limit.enter()
    RateLimit(APP, 2)
    assert rate_limit.enter()
    rate_limit.exit(request_id)


def test_stale_entries_stop_counting(configured: RedisLimiter, r: redis.Redis, layout: str) -> None:
    rate_limit = RateLimit(APP, 1)
    if layout == "dify":
        # An entry of a Dify worker that died 11 minutes ago (Dify evicts past 10): it gives way.
        r.hset(dify_hash(), "crashed", str(time.time() - 660))
        assert rate_limit.enter()
        assert not r.hexists(dify_hash(), "crashed")
        return
    # A holder that stopped renewing (a killed worker): its slot comes back within a lease (1 s here).
    configured.set_limit(rate_limit.key, 1)  # a limited key: the permit below is taken in Redis
    configured.try_acquire(rate_limit.key, id="crashed")._take()
    configured.clear_limit(rate_limit.key)
    with pytest.raises(AppInvokeQuotaExceededError):
        rate_limit.enter()
    deadline = time.monotonic() + 10
    while held(configured) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rate_limit.enter()


def test_reentering_a_held_id_at_the_limit_is_admitted(configured: RedisLimiter) -> None:
    # Dify's own enter refuses a held id's second enter when the app is full (its count check comes
    # before the HSET; test_dify_released.py shows it), so its rate_limit_context fails the last slot's
    # streamed workflow. The drop-in counts the id once.
    rate_limit = RateLimit(APP, 1)
    request_id = rate_limit.enter()
    with dify.rate_limit_context(rate_limit, request_id):
        assert held(configured) == 1
    assert held(configured) == 1  # the first enter still holds it
    rate_limit.exit(request_id)
    assert held(configured) == 0
