"""``inflight serve --layout dify`` beside an unmodified Dify worker, as the reference describes it.

``ReferenceRateLimit`` below is Dify's ``RateLimit`` reduced to what it does in Redis: ``enter`` reads
HLEN and then HSETs the request id to ``time.time()`` (a float's text), ``exit`` HDELs it, and its flush
evicts entries older than 600 s and re-reads ``max_active_requests``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import redis

from inflight_client import HttpLimiter, TooManyRequests

APP = "5f1c8e0e-6b1f-4a7e-9b7c-0d1e2f3a4b5c"


class ReferenceRateLimit:
    """Dify's RateLimit, as the reference system describes its Redis use."""

    def __init__(self, r: redis.Redis, client_id: str, max_active_requests: int) -> None:
        self.r = r
        self.max_active_requests = max_active_requests
        self.active_requests_key = f"dify:rate_limit:{client_id}:active_requests"
        self.max_active_requests_key = f"dify:rate_limit:{client_id}:max_active_requests"
        r.set(self.max_active_requests_key, max_active_requests, ex=86400)  # Dify: SETEX, one day

    def flush_cache(self, now: float | None = None) -> None:
        value = self.r.get(self.max_active_requests_key)
        if value is not None:
            self.max_active_requests = int(value)
        now = time.time() if now is None else now
        for request_id, at in self.r.hgetall(self.active_requests_key).items():
            if now - float(at) > 600:
                self.r.hdel(self.active_requests_key, request_id)

    def enter(self, request_id: str | None = None) -> str:
        request_id = request_id or str(uuid.uuid4())
        if self.r.hlen(self.active_requests_key) >= self.max_active_requests:
            raise RuntimeError("Too many requests. Please try again later.")
        self.r.hset(self.active_requests_key, request_id, str(time.time()))
        return request_id

    def exit(self, request_id: str) -> None:
        self.r.hdel(self.active_requests_key, request_id)


@pytest.fixture
def dify_serve(serve_factory: Any, redis_url: str, r: redis.Redis) -> Any:
    # (The default limit applies to an app whose limit Dify has not written; Dify's own wins here.)
    return serve_factory("--store", redis_url, "--layout", "dify", "--lease", "2s", "--default-limit", "2")


def test_dify_workers_and_inflight_enforce_one_cap(dify_serve: Any, r: redis.Redis) -> None:
    worker = ReferenceRateLimit(r, APP, 4)  # writes max_active_requests = 4, as Dify does
    http = HttpLimiter(dify_serve.url)
    try:
        ids = [worker.enter(), worker.enter()]
        a = http.try_acquire(APP)
        b = http.try_acquire(APP)
        assert (b.limit, b.in_flight) == (4, 4)  # Dify's limit key, Dify's entries counted
        with pytest.raises(TooManyRequests):
            http.try_acquire(APP)
        with pytest.raises(RuntimeError):
            worker.enter()  # Dify's worker counts inflight's entries too
        # inflight's entries are what Dify expects: ids -> epoch seconds as text, on the Redis clock.
        entries = r.hgetall(worker.active_requests_key)
        assert {k.decode() for k in entries} == {*ids, a.id, b.id}
        seconds, micros = r.time()
        redis_now = seconds + micros / 1e6
        for at in entries.values():
            assert abs(redis_now - float(at)) < 5
        worker.exit(ids[0])
        c = http.try_acquire(APP)
        a.release()
        worker.enter()
        assert r.hlen(worker.active_requests_key) == 4
        b.release()
        c.release()
        assert r.hlen(worker.active_requests_key) == 2
    finally:
        http.close()


def test_a_long_stream_of_inflights_survives_difys_flush(dify_serve: Any, r: redis.Redis) -> None:
    worker = ReferenceRateLimit(r, APP, 2)
    http = HttpLimiter(dify_serve.url, lease=2.0)
    try:
        stream = http.try_acquire(APP)
        first = float(r.hget(worker.active_requests_key, stream.id) or 0)
        time.sleep(3.0)  # past the 2 s lease: kept alive by the client's renewals
        refreshed = float(r.hget(worker.active_requests_key, stream.id) or 0)
        assert refreshed > first
        # Dify's flush, however late its clock (its age is 600 s), leaves a renewed entry alone ...
        worker.flush_cache(now=refreshed + 599)
        assert r.hexists(worker.active_requests_key, stream.id)
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
    worker = ReferenceRateLimit(r, APP, 3)
    # Three entries of crashed Dify workers, 11 minutes old: inflight evicts them when it needs room.
    old = time.time() - 660
    for n in range(3):
        r.hset(worker.active_requests_key, f"crashed-{n}", str(old))
    http = HttpLimiter(dify_serve.url)
    try:
        held = [http.try_acquire(APP) for _ in range(3)]
        assert not any(r.hexists(worker.active_requests_key, f"crashed-{n}") for n in range(3))
        for permit in held:
            permit.release()
        # Many threads through inflight: never more than 3 entries at once.
        seen: list[int] = []
        stop = time.monotonic() + 1.5

        def probe() -> None:
            while time.monotonic() < stop:
                seen.append(r.hlen(worker.active_requests_key))

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
        assert r.hlen(worker.active_requests_key) == 0
    finally:
        http.close()


def test_the_drop_in_on_difys_layout_shares_the_cap_with_unpatched_workers(
    dify_serve: Any, r: redis.Redis
) -> None:
    from inflight_client import dify

    unpatched = ReferenceRateLimit(r, APP, 3)
    limiter = dify.configure(r, layout="dify", lease=2.0)
    http = HttpLimiter(dify_serve.url)  # a Rust process on the same layout
    try:
        patched = dify.RateLimit(APP, 3)
        first = patched.enter()
        unpatched.enter()
        rust = http.try_acquire(APP)
        assert r.hlen(unpatched.active_requests_key) == 3
        with pytest.raises(dify.AppInvokeQuotaExceededError):
            patched.enter()
        with pytest.raises(RuntimeError):
            unpatched.enter()
        assert limiter.status(APP).in_flight == 3
        time.sleep(2.5)  # past the lease: the drop-in's renewals keep its entry
        assert r.hexists(unpatched.active_requests_key, first)
        patched.exit(first)
        rust.release()
        assert r.hlen(unpatched.active_requests_key) == 1
        with pytest.raises(ValueError, match="weights must be 1"):
            limiter.try_acquire(APP, weight=2)
    finally:
        http.close()
        limiter.close()
