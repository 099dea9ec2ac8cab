"""HttpLimiter against a real inflight serve (memory store)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from inflight_client import HttpError, HttpLimiter, TooManyRequests, WeightExceedsLimit


@pytest.fixture
def http(serve_factory: Any) -> Any:
    serve = serve_factory("--default-limit", "2", "--admin-token", "secret")
    limiter = HttpLimiter(serve.url, token="secret", lease=5.0)
    yield limiter
    limiter.close()


def test_admits_refuses_and_releases(http: HttpLimiter) -> None:
    a = http.try_acquire("app/1 x")  # percent-encoded in the path
    assert (a.key, a.limit, a.in_flight) == ("app/1 x", 2, 1)
    with http.try_acquire("app/1 x", id="req-1") as b:
        assert b.id == "req-1" and b.in_flight == 2
        again = http.try_acquire("app/1 x", id="req-1")
        assert again.in_flight == 2  # a held id counts once
        with pytest.raises(TooManyRequests) as refused:
            http.try_acquire("app/1 x")
        assert refused.value.key == "app/1 x"
    # Two permits of this process under one id hold the slot until the last of them goes.
    assert http.status("app/1 x").in_flight == 2
    assert again.release() is True
    assert http.status("app/1 x").in_flight == 1
    assert a.release() is True and a.release() is False
    assert http.status("app/1 x").in_flight == 0


def test_weights_limits_and_the_token(http: HttpLimiter, serve_factory: Any) -> None:
    with pytest.raises(WeightExceedsLimit):
        http.try_acquire("k", weight=3)
    assert http.set_limit("k", 4).limit == 4
    heavy = http.try_acquire("k", weight=3)
    with pytest.raises(TooManyRequests):
        http.try_acquire("k", weight=2)
    heavy.release()
    assert http.clear_limit("k").limit == 2
    anonymous = HttpLimiter(http.base_url)
    with pytest.raises(HttpError) as refused:
        anonymous.set_limit("k", 9)
    assert refused.value.status == 401
    anonymous.close()


def test_try_acquire_all_is_atomic(http: HttpLimiter) -> None:
    http.set_limit("tenant", 1)
    first = http.try_acquire_all(["app:a", "tenant", "app:a"])
    assert first.keys == ("app:a", "tenant")
    with pytest.raises(TooManyRequests) as refused:
        http.try_acquire_all(["app:b", "tenant"])
    assert refused.value.key == "tenant"
    assert http.status("app:b").in_flight == 0
    first.release()
    assert http.status("tenant").in_flight == 0


def test_renewal_keeps_a_short_lease(http: HttpLimiter) -> None:
    permit = http.try_acquire("k", lease=0.6)
    time.sleep(2.0)
    assert permit.held
    assert http.status("k").in_flight == 1
    permit.release()
    assert http.status("k").in_flight == 0


def test_guard_stream(http: HttpLimiter) -> None:
    assert list(http.guard_stream(http.try_acquire("k"), iter([1, 2]))) == [1, 2]
    http.guard_stream(http.try_acquire("k"), iter([1, 2])).close()
    assert http.status("k").in_flight == 0
