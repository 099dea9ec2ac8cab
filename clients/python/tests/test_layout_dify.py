"""``inflight serve --layout dify`` beside an unmodified Dify worker: ``ReleasedDify`` (``dify_released.py``),
Dify 1.16.1's ``RateLimit`` reduced to what it does in Redis."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from dify_released import DifyRedis, Refused, ReleasedDify

from inflight_client import HttpLimiter, TooManyRequests

APP = "5f1c8e0e-6b1f-4a7e-9b7c-0d1e2f3a4b5c"


@pytest.fixture
def dify_serve(serve_factory: Any, redis_url: str, r: redis.Redis) -> Any:
    # (The default limit applies to an app whose limit Dify has not written; Dify's own wins here.)
    return serve_factory("--store", redis_url, "--layout", "dify", "--lease", "2s", "--default-limit", "2")


def test_dify_workers_and_inflight_enforce_one_cap(dify_serve: Any, r: redis.Redis) -> None:
    worker = ReleasedDify(DifyRedis(r), APP, 4)  # writes max_active_requests = 4, as Dify does
    http = HttpLimiter(dify_serve.url)
    try:
        ids = [worker.enter(), worker.enter()]
        a = http.try_acquire(APP)
        b = http.try_acquire(APP)
        assert (b.limit, b.in_flight) == (4, 4)  # Dify's limit key, Dify's entries counted
        with pytest.raises(TooManyRequests):
            http.try_acquire(APP)
        with pytest.raises(Refused):
            worker.enter()  # Dify's worker counts inflight's entries too
        # inflight's entries are what Dify expects: ids -> epoch seconds as text, on the Redis clock.
        entries = r.hgetall(worker.active)
        assert {k.decode() for k in entries} == {*ids, a.id, b.id}
        seconds, micros = r.time()
        redis_now = seconds + micros / 1e6
        for at in entries.values():
            assert abs(redis_now - float(at)) < 5
        worker.exit(ids[0])
        c = http.try_acquire(APP)
        a.release()
        worker.enter()
        assert r.hlen(worker.active) == 4
        b.release()
        c.release()
        assert r.hlen(worker.active) == 2
    finally:
        http.close()


def test_a_long_stream_of_inflights_survives_difys_flush(dify_serve: Any, r: redis.Redis) -> None:
    now = [time.time()]
    worker = ReleasedDify(DifyRedis(r), APP, 2, clock=lambda: now[0])
    http = HttpLimiter(dify_serve.url, lease=2.0)
    try:
        stream = http.try_acquire(APP)
        first = float(r.hget(worker.active, stream.id) or 0)
        time.sleep(3.0)  # past the 2 s lease: kept alive by the client's renewals
        refreshed = float(r.hget(worker.active, stream.id) or 0)
        assert refreshed > first
        # Dify's flush, however late its clock (its age is 600 s), leaves a renewed entry alone ...
        now[0] = refreshed + 599
        worker.flush_cache()
        assert r.hexists(worker.active, stream.id)
        # ... and inflight's limit key is Dify's: set through inflight, read by Dify's flush.
        http_limit = http.set_limit(APP, 3)
        assert http_limit.limit == 3
        worker.flush_cache()
        assert worker.max_active_requests == 3
        stream.release()
    finally:
        http.close()


def test_stale_dify_entries_give_way_and_concurrent_enters_never_pass_the_cap(
    dify_serve: Any, r: redis.Redis
) -> None:
    worker = ReleasedDify(DifyRedis(r), APP, 3)
    # Three entries of crashed Dify workers, 11 minutes old: inflight evicts them when it needs room.
    old = time.time() - 660
    for n in range(3):
        r.hset(worker.active, f"crashed-{n}", str(old))
    http = HttpLimiter(dify_serve.url)
    try:
        held = [http.try_acquire(APP) for _ in range(3)]
        assert not any(r.hexists(worker.active, f"crashed-{n}") for n in range(3))
        for permit in held:
            permit.release()
        # Many threads through inflight: never more than 3 entries at once.
        seen: list[int] = []
        stop = time.monotonic() + 1.5

        def probe() -> None:
            while time.monotonic() < stop:
                seen.append(r.hlen(worker.active))

        def hammer() -> None:
            while time.monotonic() < stop:
                try:
                    with http.try_acquire(APP):
                        pass
                except TooManyRequests:
                    pass

        threads = [threading.Thread(target=hammer) for _ in range(6)] + [threading.Thread(target=probe)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen and max(seen) <= 3
        assert r.hlen(worker.active) == 0
    finally:
        http.close()


def test_the_drop_in_on_difys_layout_shares_the_cap_with_unpatched_workers(
    dify_serve: Any, r: redis.Redis
) -> None:
    from inflight_client import dify

    unpatched = ReleasedDify(DifyRedis(r), APP, 3)
    limiter = dify.configure(r, layout="dify", lease=2.0)
    http = HttpLimiter(dify_serve.url)  # a Rust process on the same layout
    try:
        patched = dify.RateLimit(APP, 3)
        first = patched.enter()
        unpatched.enter()
        rust = http.try_acquire(APP)
        assert r.hlen(unpatched.active) == 3
        with pytest.raises(dify.AppInvokeQuotaExceededError):
            patched.enter()
        with pytest.raises(Refused):
            unpatched.enter()
        assert limiter.status(APP).in_flight == 3
        time.sleep(2.5)  # past the lease: the drop-in's renewals keep its entry
        assert r.hexists(unpatched.active, first)
        patched.exit(first)
        rust.release()
        assert r.hlen(unpatched.active) == 1
        with pytest.raises(ValueError, match="weights must be 1"):
            limiter.try_acquire(APP, weight=2)
    finally:
        http.close()
        limiter.close()
